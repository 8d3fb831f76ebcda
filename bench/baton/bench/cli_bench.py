"""CLI start-up benchmark: the CPU a ``baton`` command costs before it does anything.

A health probe runs every few seconds in every container and ``baton --help`` is the first
thing a new user types, so their cost is what Python, click and Baton's imports cost. Each
command runs ``n`` times as a child process; its CPU time (user + sys) is read from
``getrusage(RUSAGE_CHILDREN)`` around the wait, and the median is reported beside
``python -c pass`` measured in the same run (the floor no command can go under). Target:
``baton --help`` and ``baton health`` under 150 ms of CPU.

Figures, not assertions: a table on stdout and ``bench/results/cli.json``.
"""

from __future__ import annotations

import resource
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from rich.console import Console
from rich.table import Table

from baton.bench.common import Result, Row, environment

NAME = "cli"
DESCRIPTION = "CPU ms of `baton --help` and `baton health` start-up, beside `python -c pass`"
TARGET_MS = 150.0


@dataclass(frozen=True)
class Config:
    runs: int = 15
    warmup: int = 2  # fill the page cache and the bytecode cache first


QUICK = Config(runs=5, warmup=1)


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released): the probe gets no answer."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def commands() -> dict[str, list[str]]:
    py = sys.executable
    return {
        "python -c pass (baseline)": [py, "-c", "pass"],
        "baton --help": [py, "-m", "baton", "--help"],
        "baton health --help": [py, "-m", "baton", "health", "--help"],
        "baton health --port (nothing there)": [py, "-m", "baton", "health", "--port",
                                                str(_closed_port())],
    }


def measure(argv: list[str]) -> tuple[float, float]:
    """One run of ``argv``: (CPU seconds of the child, wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


async def run(quick: bool = False, console: Console | None = None) -> Result:
    cfg = QUICK if quick else Config()
    console = console or Console()
    figures: dict[str, dict[str, float]] = {}
    rows = []
    for label, argv in commands().items():
        for _ in range(cfg.warmup):
            measure(argv)
        samples = [measure(argv) for _ in range(cfg.runs)]
        cpu = statistics.median(c for c, _ in samples) * 1000
        wall = statistics.median(w for _, w in samples) * 1000
        figures[label] = {"cpu_ms": round(cpu, 1), "wall_ms": round(wall, 1)}
        rows.append(Row(mode="cli", operation=label, writers=1, n=cfg.runs,
                        p50_us=wall * 1000, p99_us=max(w for _, w in samples) * 1e6,
                        ops_per_s=1000 / wall if wall else 0.0, client_cpu_us=cpu * 1000,
                        note="median CPU of the child process"))
    base = figures["python -c pass (baseline)"]["cpu_ms"]
    table = Table(title=f"CLI start-up, median of {cfg.runs} runs (target < {TARGET_MS:g} ms "
                        "CPU)", title_justify="left")
    for col in ("command", "CPU ms", "over python -c pass", "wall ms", "target"):
        table.add_column(col, justify="left" if col == "command" else "right")
    for label, f in figures.items():
        baseline = label.startswith("python")
        verdict = "" if baseline else ("ok" if f["cpu_ms"] < TARGET_MS else "OVER")
        table.add_row(label, f"{f['cpu_ms']:.1f}", "" if baseline else f"+{f['cpu_ms'] - base:.1f}",
                      f"{f['wall_ms']:.1f}", verdict)
    console.print(table)
    return Result(NAME, rows, env=environment(),
                  extra={"config": asdict(cfg), "target_cpu_ms": TARGET_MS,
                         "figures": figures})
