"""The tables ``bench e2e`` prints from its per-level figures (``per_level``: one dict per
concurrency level, as :func:`baton.bench.e2e_bench.session_levels` returns them) and its
targets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["WIRE_ROWS", "print_cpu", "print_io", "print_targets"]

#: The traffic rows of the CPU table: (key in ``wire_per_session``, label).
WIRE_ROWS = (
    ("redis_bytes_in", "Redis bytes in / session"),
    ("redis_bytes_out", "Redis bytes out / session"),
    ("nats_in_msgs", "NATS messages in / session"),
    ("nats_out_msgs", "NATS messages out / session"),
    ("nats_in_bytes", "NATS bytes in / session"),
    ("nats_out_bytes", "NATS bytes out / session"),
)


def _by_process(title: str, per_level: dict[str, dict[str, Any]], key: str,
                cell: Callable[[Any], str]) -> Table:
    """A row per process of ``per_level[...][key]``, a column per level."""
    table = Table(title=title, title_justify="left")
    table.add_column("process")
    for level in per_level:
        table.add_column(level, justify="right")
    for name in next(iter(per_level.values()))[key]:
        table.add_row(name, *[cell(v[key][name]) for v in per_level.values()])
    return table


def print_cpu(per_level: dict[str, dict[str, Any]], console: Console) -> None:
    """CPU per session by process, the Redis commands and the traffic; then :func:`print_io`."""
    table = _by_process("CPU ms per five-notice session, by process (from /proc; 2 cores = "
                        "2,000 ms/s available)", per_level, "cpu_ms_per_session",
                        lambda ms: f"{ms:.2f}")
    table.add_row("[b]total[/b]", *[f"{sum(v['cpu_ms_per_session'].values()):.2f}"
                                    for v in per_level.values()])
    table.add_row("Redis commands / session",
                  *[f"{v['redis_calls_per_session']:.1f}" for v in per_level.values()])
    for key, label in WIRE_ROWS:
        if all(key in v.get("wire_per_session", {}) for v in per_level.values()):
            table.add_row(label, *[f"{v['wire_per_session'][key]:,.1f}"
                                   for v in per_level.values()])
    console.print(table)
    print_io(per_level, console)


def print_io(per_level: dict[str, dict[str, Any]], console: Console) -> None:
    """Read and write system calls per session by process, when the run measured them."""
    if not all("io_calls_per_session" in v for v in per_level.values()):
        return
    console.print(_by_process(
        "read() / write() calls per five-notice session, by process (from /proc/PID/io: the "
        "socket I/O of Redis, NATS and Baton's services on uvloop)", per_level,
        "io_calls_per_session", lambda rw: f"{rw[0]:.1f} / {rw[1]:.1f}"))


def print_targets(targets: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="Targets", title_justify="left")
    for col in ("figure", "measured", "target", "ratio", "met"):
        table.add_column(col, justify="left" if col == "figure" else "right")
    for t in targets:
        ratio = t.get("ratio_value")
        table.add_row(t["figure"], t["measured"], t["target"],
                      "" if ratio is None else f"{ratio:.2f}",
                      "" if not t["target"] else "yes" if t["met"] else "[red]no[/red]")
    console.print(table)
