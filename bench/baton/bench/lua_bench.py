"""Where the session scripts' own Lua time goes, line by line, in five-notice sessions.

``baton bench redis`` shows that most of a script's time is the Lua interpreter's own work,
not the data commands it runs. This bench says which lines: it starts a stack of the e2e
shape (1 Brain, 1 Hands, 1 relay, the mail service answering at once) whose every process
loads the profiled scripts of :mod:`baton.store.lua_profile`, runs sessions at concurrency 1
and 32, and prints per script its calls and microseconds per session, then its costliest
lines (net of the checkpoints' own cost, measured on the same server first) with their text.

The profiled scripts are slower than the real ones (every checkpoint reads the clock), and
the clock is wall time: on a busy machine (concurrency 32 on two cores) a server waiting for
a CPU charges the wait to the line it is at, so concurrency 1 ranks lines more cleanly. The
figures rank lines within a run, they are not the scripts' cost: ``baton bench redis`` gives
that.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from baton.bench.common import Result, Row, environment
from baton.bench.sessions import bench_client, sessions
from baton.devkit.devstack import DevStack
from baton.store import lua_profile

NAME = "lua"
DESCRIPTION = "the session scripts' Lua time per five-notice session, line by line (profiled)"

LEVELS = [(1, 40, 5), (32, 128, 1)]  # (concurrency, sessions, warm-up sessions per flow)
QUICK_LEVELS = [(1, 8, 1), (32, 32, 1)]
TOP_LINES = 8


def lines_by_script(profile: dict[str, int], cost_us: float, sessions_run: int
                    ) -> dict[str, dict[str, Any]]:
    """The profile hash as per-session figures: per script its calls, its time (charged,
    and net of the checkpoints) and each label's net microseconds and runs."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in profile.items():
        parts = key.split(":")
        if len(parts) == 2 and parts[1] == "calls":
            out.setdefault(parts[0], {"lines": {}})["calls"] = value / sessions_run
        elif len(parts) == 2:
            runs = profile.get(f"{key}:n", 0)
            entry = out.setdefault(parts[0], {"lines": {}})["lines"]
            entry[parts[1]] = {"net_us": (value - runs * cost_us) / sessions_run,
                               "runs": runs / sessions_run}
    for script in out.values():
        script.setdefault("calls", 0.0)
        script["net_us"] = sum(line["net_us"] for line in script["lines"].values())
    return out


@functools.cache
def _lines(script: str) -> list[str]:
    return (resources.files("baton.store") / "lua" / f"{script}.lua").read_text().splitlines()


def _text(script: str, label: str) -> str:
    if not label.isdigit():
        return {"prelude": "(helpers, guard, commit-id wrapper)"}.get(label, label)
    return _lines(script)[int(label) - 1].strip()[:90]


def _print(level: str, scripts: dict[str, dict[str, Any]], cost_us: float,
           console: Console) -> None:
    total = sum(s["net_us"] for s in scripts.values()) or 1.0
    table = Table(title=f"{level}: Lua time per session by script line (net of "
                        f"{cost_us:.2f} µs per checkpoint)", title_justify="left")
    for col in ("script:line", "µs/session", "share", "runs/session", "statement"):
        table.add_column(col, justify="left" if col in ("script:line", "statement") else "right")
    for name, s in sorted(scripts.items(), key=lambda kv: -kv[1]["net_us"]):
        table.add_row(f"[bold]{name}[/bold]", f"{s['net_us']:,.0f}", f"{s['net_us'] / total:.0%}",
                      f"{s['calls']:.2f}", "(the script in all; runs: its calls)")
        ranked = sorted(s["lines"].items(), key=lambda kv: -kv[1]["net_us"])[:TOP_LINES]
        for label, line in ranked:
            table.add_row(f"  {name}:{label}", f"{line['net_us']:,.1f}",
                          f"{line['net_us'] / total:.1%}", f"{line['runs']:.2f}",
                          _text(name, label))
    console.print(table)


async def run(quick: bool = False, console: Console | None = None) -> Result:
    console = console or Console()
    rows: list[Row] = []
    extra: dict[str, Any] = {"levels": {}}
    base = Path(tempfile.mkdtemp(prefix="baton-lua-"))
    try:
        with lua_profile.profiling():  # this process's client too
            await _levels(base, quick, console, rows, extra)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    console.print("[dim]profiled scripts are slower than the real ones: the figures rank "
                  "lines, `baton bench redis` gives the scripts' cost[/dim]")
    return Result(NAME, rows, env=environment(), extra=extra)


async def _levels(base: Path, quick: bool, console: Console, rows: list[Row],
                  extra: dict[str, Any]) -> None:
    """Each level's sessions on a profiled stack: its figures into ``rows`` and ``extra``."""
    async with DevStack(base, brains=1, hands=1, relays=1, mail_delay_ms=0, durable=False,
                        namespace="bench", mail_persist=False,
                        env={lua_profile.ENV: "1"}) as stack:
        client = await bench_client(stack)
        redis = client.store.redis
        try:
            cost = await lua_profile.checkpoint_cost(redis)
            extra["checkpoint_us"] = cost
            for conc, total, warmup in QUICK_LEVELS if quick else LEVELS:
                level = f"c={conc}"
                await sessions(client, conc, warmup * conc, 0)
                await redis.delete(lua_profile.PROFILE_KEY)
                done = await sessions(client, conc, total, 0)
                n = len(done.samples_ns)
                raw = await redis.hgetall(lua_profile.PROFILE_KEY)
                scripts = lines_by_script({str(k): int(v) for k, v in raw.items()}, cost, n)
                extra["levels"][level] = {"sessions": n, "scripts": scripts}
                _print(level, scripts, cost, console)
                rows.extend(
                    Row(mode=level, operation=f"lua {name}", writers=conc, n=n,
                        p50_us=float("nan"), p99_us=float("nan"), ops_per_s=float("nan"),
                        note=f"{s['net_us']:,.0f} µs/session net, "
                             f"{s['calls']:.2f} calls/session")
                    for name, s in scripts.items())
        finally:
            await client.close()


__all__ = ["DESCRIPTION", "NAME", "lines_by_script", "run"]
