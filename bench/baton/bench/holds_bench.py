"""What holding the lease for tool results saves: the same stack with and without holds.

Two stacks of the e2e shape (1 Brain, 1 Hands, 1 relay, the mail service answering at once)
run side by side: one with ``BATON_BRAIN_HOLD_MS=0`` (every result wakes its session through
the relay, as before holds), one as shipped (the Brain holds its lease for the results of the
runs it dispatched; baton.brain.held). Each round drives both, in an order drawn from a fixed
seed: five-notice sessions at concurrency 32 (CPU per session by process, sessions/s), then
one at a time at concurrency 1 (latency). Each figure of the stack with holds is paired with
its round's run with holds off, so the machine's drift between rounds cancels out; a control
stack, holds off again, shows how far from zero a difference must be to count.

Figures: the paired change of the stack's CPU per session (Brain, Hands, relay, Redis, NATS:
the mail service and the client apart), of sessions/s and of the p50 at concurrency 1, with a
95% interval of each median, and the CPU per session by process.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from baton.bench.cold_bench import cpu_ns, stack_pids
from baton.bench.common import Result, Row, environment
from baton.bench.obs_bench import describe, spread
from baton.bench.sessions import FIVE, bench_client, session_call, sessions
from baton.devkit.devstack import DevStack

NAME = "holds"
DESCRIPTION = "five-notice sessions with and without holds, paired (CPU, sessions/s, p50)"

CONCURRENCY = 32
#: The Baton processes whose CPU counts (the mail service is the outside world).
OWN = ("brain", "hands", "relay", "redis", "nats")
MODES = {"holds off": {"BATON_BRAIN_HOLD_MS": "0"}, "holds": {},
         "holds off again": {"BATON_BRAIN_HOLD_MS": "0"}}
OFF = "holds off"  # the mode every other one is paired with
ORDER_SEED = 15


@dataclass(frozen=True)
class Config:
    rounds: int = 12
    per_round: int = 128  # sessions at CONCURRENCY per stack and round (a multiple of it)
    c1: int = 30  # sessions one at a time per stack and round


QUICK = Config(rounds=3, per_round=64, c1=10)


async def run(quick: bool = False, console: Console | None = None,
              cfg: Config | None = None) -> Result:
    console = console or Console()
    cfg = cfg or (QUICK if quick else Config())
    rounds, per_round, c1_n = cfg.rounds, cfg.per_round, cfg.c1
    cpu: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}  # per run, µs/session
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    measured: dict[str, list[int]] = {m: [] for m in MODES}  # sessions timed per run
    p50s: dict[str, list[float]] = {m: [] for m in MODES}  # ms
    base = Path(tempfile.mkdtemp(prefix="baton-holds-"))
    try:
        async with contextlib.AsyncExitStack() as stacks:
            clients: dict[str, Any] = {}
            pids: dict[str, dict[str, int]] = {}
            for i, (mode, env) in enumerate(MODES.items()):
                stack = await stacks.enter_async_context(DevStack(
                    base / str(i), brains=1, hands=1, relays=1, mail_delay_ms=0,
                    durable=False, namespace=f"holds{i}", mail_persist=False, env=env))
                pids[mode] = {name.split("-")[0]: pid for name, pid in stack_pids(stack).items()}
                clients[mode] = await bench_client(stack)
                stacks.push_async_callback(clients[mode].close)
            for mode in MODES:  # warm every stack: connections, first sessions
                await sessions(clients[mode], CONCURRENCY, CONCURRENCY, 1)

            async def drive(mode: str) -> None:
                before = {role: cpu_ns(p) for role, p in pids[mode].items()}
                done = await sessions(clients[mode], CONCURRENCY, per_round, 0)
                n = len(done.samples_ns)
                measured[mode].append(n)
                cpu[mode].append({role: (cpu_ns(p) - before[role]) / 1e3 / n
                                  for role, p in pids[mode].items()})
                rates[mode].append(n / done.elapsed_s)
                call, lat = session_call(clients[mode], FIVE), []
                for i in range(c1_n):
                    t0 = time.perf_counter()
                    await call(i)
                    lat.append((time.perf_counter() - t0) * 1000)
                p50s[mode].append(statistics.median(lat))

            shuffle = random.Random(ORDER_SEED)
            for r in range(rounds):
                order = list(MODES)
                shuffle.shuffle(order)
                for mode in order:
                    await drive(mode)
                console.print(f"[dim]round {r + 1}/{rounds}: " + ", ".join(
                    f"{m} {_own(cpu[m][-1]):,.0f} µs/session, p50 {p50s[m][-1]:.2f} ms"
                    for m in MODES) + "[/dim]")
    finally:
        shutil.rmtree(base, ignore_errors=True)

    paired = {m: {"cpu": spread([_own(a) / _own(b) - 1 for a, b in zip(cpu[m], cpu[OFF],
                                                                          strict=True)]),
                  "rate": spread([a / b - 1 for a, b in zip(rates[m], rates[OFF],
                                                            strict=True)]),
                  "p50": spread([a / b - 1 for a, b in zip(p50s[m], p50s[OFF],
                                                           strict=True)])}
              for m in MODES if m != OFF}
    table = Table(title=f"Holds (five-notice sessions; {rounds} rounds, {per_round} "
                        f"sessions at concurrency {CONCURRENCY} and {c1_n} at concurrency 1 "
                        "per stack and round, each paired with its round's run with holds off)",
                  title_justify="left")
    for col in ("mode", "CPU µs/session", "change (paired)", "sessions/s", "change (paired)",
                "p50 ms, c=1", "change (paired)"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for mode in MODES:
        p = paired.get(mode)
        table.add_row(mode, f"{statistics.median(_own(c) for c in cpu[mode]):,.0f}",
                      describe(p["cpu"]) if p else "",
                      f"{statistics.median(rates[mode]):.1f}", describe(p["rate"]) if p else "",
                      f"{statistics.median(p50s[mode]):.2f}", describe(p["p50"]) if p else "")
    console.print(table)
    roles = sorted({r for runs in cpu.values() for c in runs for r in c})
    split = Table(title="CPU µs per session by process (medians of the rounds)",
                  title_justify="left")
    split.add_column("mode")
    for role in roles:
        split.add_column(role, justify="right")
    for mode, runs in cpu.items():
        split.add_row(mode, *(f"{statistics.median(c[role] for c in runs):,.0f}"
                              for role in roles))
    console.print(split)
    console.print("[dim]the stack's CPU counts Brain, Hands, relay, Redis and NATS (the mail "
                  "service and the client apart); 'holds off again' is the configuration "
                  "without holds on a stack of its own: a change within its distance from zero "
                  "is not told apart from nothing[/dim]")
    rows = [Row(mode=mode, operation=f"sessions c={CONCURRENCY}", writers=CONCURRENCY,
                n=sum(measured[mode]), p50_us=statistics.median(p50s[mode]) * 1000,
                p99_us=float("nan"), ops_per_s=statistics.median(rates[mode]),
                note="p50 at concurrency 1; medians of rounds")
            for mode in MODES]
    extra = {"config": asdict(cfg), "rounds": rounds, "sessions_per_round": per_round,
             "c1_sessions": c1_n, "sessions_measured": measured,
             "cpu_us_per_session": cpu, "sessions_per_s": rates, "p50_ms_c1": p50s,
             "paired": paired, "modes": MODES}
    return Result(NAME, rows, env=environment(), extra=extra)


def _own(by_role: dict[str, float]) -> float:
    """The stack's own CPU per session: Baton's processes, not the mail service."""
    return sum(v for role, v in by_role.items() if role in OWN)
