"""Cost of observability: sessions/s at concurrency 32 with logs and tracing on vs off.

Stacks of the same shape (their own Redis, NATS and mail service; 1 Brain, 1 Hands, 1 relay)
run side by side; only one is driven at a time (the others idle at a few ms of CPU per
second). Each mode is a configuration of the three services:

* **off**: WARNING logs, no exporter;
* **logs**: INFO logs as shipped (each unusual message's canonical line in full, the routine
  ones counted in a summary line, see :mod:`baton.observability.canonical`), no exporter;
* **shipped**: INFO logs, tracing and metrics as the deploy files configure them (OTLP
  http/protobuf, batched, with the deploy files' sampler: parent-based, 1% of the roots) to
  a sink in this process that answers 200;
* **1 in 10**: the same with a tenth of the traces sampled (the deploy files' former ratio);
* **all spans**: the same with every trace sampled;
* **off again**: the off configuration once more, as a mode of its own: its paired cost is
  the bench's own bias between two runs of the same code and configuration (an A/A
  control), the floor under which a mode's cost is not told apart from nothing.

Two stacks of the same code and configuration are not alike: the control, on a stack of its
own for a whole run, came out at -8% to +3% of sessions/s in runs of an earlier version
(where its processes landed on the machine, and what its servers went through). So the
modes move from stack to stack: the run is as many epochs as there are modes, and at each
epoch every stack's three services are stopped and started again with the next mode's
configuration (a Latin square: each mode runs one epoch on every stack, and every stack
serves every mode), then warmed with a few sessions. A stack's own bias then weighs on every
mode alike.

The variants are interleaved: a round drives every stack once with the same five-notice
sessions, in an order drawn at random for each round (from a fixed seed: a rotation would
keep some stacks at even places and others at odd ones, and each after the same
neighbours), and each mode's cost is taken against the off run of its own round, so a
change of load on the shared machine moves both halves of a pair and a steady drift
cancels. Every stack is driven equally often: an earlier version bracketed each run by off
runs, driving the off stack twice as often as the others, and its Brain then spent 70-130
us more per session than the identical control's (the control's cost came out at -2% to
-3% in every run, made before or after the off stack alike). Two figures per mode, each
the median of the rounds' paired costs with their spread (interquartile range, and
min..max):

* **CPU per session**: the CPU every process of its stack (Redis, NATS, the three services)
  spent per session, over the same round's off run. Throughput at concurrency 32 is bound by
  CPU, so this is the throughput a machine running only Baton loses, and other work on the
  machine moves it less (it slows the sessions more than the CPU each one needs);
* **throughput**: one minus the ratio of the sessions/s to the same round's off run; on a
  shared machine the load changes between the halves of a pair make this one noisier.

The output says how many rounds ran. Target: the cost of the shipped configuration is at most 5%.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import shutil
import signal
import statistics
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from rich.console import Console
from rich.table import Table

from baton.bench.cold_bench import cpu_ns
from baton.bench.common import Result, Row, environment
from baton.bench.sessions import bench_client, sessions
from baton.devkit.devstack import SERVICE_ROLES, DevStack
from baton.devkit.servers import free_port

NAME = "obs"
DESCRIPTION = "sessions/s at concurrency 32 with logs and tracing on vs off (paired)"

CONCURRENCY = 32
TARGET_COST = 0.05
#: The A/A control: the off configuration on a stack of its own (see the module docstring).
CONTROL = "off again"
#: Each round's order of the stacks is a permutation drawn from this seed: the same every run.
ORDER_SEED = 15


def spread(values: list[float]) -> dict[str, float]:
    """Median of paired costs (fractions), a 95% confidence interval of that median, the
    quartiles and the extremes.

    The interval is distribution-free: the order statistics ``n/2 -+ 0.98 sqrt(n)`` (the
    sign test's normal approximation), so one wild pair moves neither the median nor it."""
    ordered = sorted(values)
    n = len(ordered)
    if n >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    half = 0.98 * math.sqrt(n)
    low = max(0, math.floor(n / 2 - half))
    high = min(n - 1, math.ceil(n / 2 + half) - 1)
    return {"median": statistics.median(ordered), "ci_low": ordered[low],
            "ci_high": ordered[high], "q1": q1, "q3": q3, "min": ordered[0],
            "max": ordered[-1], "pairs": n}


def describe(stats: dict[str, float]) -> str:
    """``+4.1% (95% CI +3.0..+5.2; IQR +2.2..+6.0)``."""
    return (f"{stats['median']:+.1%} (95% CI {stats['ci_low']:+.1%}..{stats['ci_high']:+.1%}; "
            f"IQR {stats['q1']:+.1%}..{stats['q3']:+.1%})")


@contextlib.asynccontextmanager
async def otlp_sink(
    on_body: Callable[[str, bytes], None] | None = None,
) -> AsyncIterator[tuple[str, list[int]]]:
    """An OTLP/HTTP endpoint that accepts everything; yields its URL and the bytes received.
    ``on_body`` sees each export's path and body (tests decode them)."""
    received = [0]

    async def accept(request: web.Request) -> web.Response:
        body = await request.read()
        received[0] += len(body)
        if on_body is not None:
            on_body(request.path, body)
        return web.Response(status=200, content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/{tail:.*}", accept)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        await runner.cleanup()


#: The deploy files' sampler (deploy/compose.yaml, deploy/k8s): parent-based, a ratio of roots.
SHIPPED_SAMPLER = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                   "OTEL_TRACES_SAMPLER_ARG": "0.01"}


def modes(endpoint: str) -> dict[str, dict[str, str]]:
    traced = {"BATON_LOG_LEVEL": "info", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
              "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_SERVICE_NAME": "baton-bench"}
    return {
        "off": {"BATON_LOG_LEVEL": "warning"},
        "logs": {"BATON_LOG_LEVEL": "info"},
        "shipped": {**traced, **SHIPPED_SAMPLER},
        "1 in 10": {**traced, **SHIPPED_SAMPLER, "OTEL_TRACES_SAMPLER_ARG": "0.1"},
        "all spans": {**traced, "OTEL_TRACES_SAMPLER": "parentbased_always_on"},
        CONTROL: {"BATON_LOG_LEVEL": "warning"},
    }


async def configure(stack: DevStack, env: dict[str, str]) -> dict[str, int]:
    """Stop ``stack``'s services (SIGTERM: they drain) and start one of each role with
    ``env`` over the stack's own; the PID of each process of the stack by role (``redis``,
    ``nats``, ``brain``, ``hands``, ``relay``)."""
    for proc in stack.procs():
        if proc.role in SERVICE_ROLES and proc.alive:
            stack.kill(proc.name, signal.SIGTERM, respawn=False)
            await stack.wait_exit(proc.name)
    assert stack.servers is not None
    pids = {"redis": stack.servers.redis.pid, "nats": stack.servers.nats.pid}
    relay = await stack.spawn("relay", env=env)  # the relay first: it makes the streams
    brain, hands = await asyncio.gather(stack.spawn("brain", env=env),
                                        stack.spawn("hands", env=env))
    pids.update(relay=relay.pid, brain=brain.pid, hands=hands.pid)
    return {role: pid for role, pid in pids.items() if pid}


async def run(quick: bool = False, console: Console | None = None) -> Result:
    console = console or Console()
    # Rounds per epoch; one epoch per mode (see the module docstring).
    per_epoch, per_round = (1, 64) if quick else (7, 64)
    rates: dict[str, list[float]] = {}
    cpu_pairs: dict[str, list[float]] = {}
    rate_pairs: dict[str, list[float]] = {}
    cpu_ms: dict[str, list[float]] = {}
    # per round, the CPU ms per session each process spent over the round's off run
    role_pairs: dict[str, dict[str, list[float]]] = {}
    base = Path(tempfile.mkdtemp(prefix="baton-obs-"))
    try:
        async with otlp_sink() as (endpoint, received), contextlib.AsyncExitStack() as stacks:
            envs = modes(endpoint)
            names = list(envs)
            rounds = per_epoch * len(names)
            rates = {m: [] for m in names}
            clients: list[Any] = []  # by stack
            all_stacks: list[DevStack] = []
            pids: dict[str, dict[str, int]] = {}  # mode -> process role -> pid
            placed: dict[str, int] = {}  # mode -> the stack it runs on this epoch
            cpu_ms = {m: [] for m in names}  # per run, per session
            cpu_pairs = {m: [] for m in names[1:]}  # per round, against its off run
            rate_pairs = {m: [] for m in names[1:]}
            role_pairs = {m: {} for m in names[1:]}
            for i in range(len(names)):  # the servers; the services come with a mode
                stack = await stacks.enter_async_context(DevStack(
                    base / str(i), brains=0, hands=0, relays=0, namespace=f"obs{i}",
                    mail_persist=False))
                all_stacks.append(stack)
                clients.append(await bench_client(stack))
                stacks.push_async_callback(clients[-1].close)

            async def place(epoch: int) -> None:
                """Each mode's services on the stack the epoch gives it, then warm them:
                connections, first sessions."""
                placed.update({m: (i + epoch) % len(names) for i, m in enumerate(names)})
                found = await asyncio.gather(*(configure(all_stacks[placed[m]], envs[m])
                                               for m in names))
                pids.update(zip(names, found, strict=True))
                for mode in names:
                    await sessions(clients[placed[mode]], CONCURRENCY, CONCURRENCY, 1)

            async def drive(mode: str) -> tuple[float, float, dict[str, float]]:
                """CPU ms per session (in all and by process) and sessions/s of one run of
                ``mode``'s stack."""
                before = {role: cpu_ns(p) for role, p in pids[mode].items()}
                done = await sessions(clients[placed[mode]], CONCURRENCY, per_round, 0)
                by_role = {role: (cpu_ns(p) - before[role]) / 1e6 / per_round
                           for role, p in pids[mode].items()}
                cpu = sum(by_role.values())
                cpu_ms[mode].append(cpu)
                rates[mode].append(per_round / done.elapsed_s)
                return cpu, rates[mode][-1], by_role

            others = names[1:]
            shuffle = random.Random(ORDER_SEED)
            for r in range(rounds):
                if r % per_epoch == 0:
                    await place(r // per_epoch)
                order = list(names)
                shuffle.shuffle(order)
                runs = {}
                for mode in order:
                    runs[mode] = await drive(mode)
                off_cpu, off_rate, off_roles = runs["off"]
                for mode in others:
                    cpu, rate, by_role = runs[mode]
                    cpu_pairs[mode].append(cpu / off_cpu - 1)
                    rate_pairs[mode].append(1 - rate / off_rate)
                    for role, ms in by_role.items():
                        role_pairs[mode].setdefault(role, []).append(ms - off_roles[role])
                console.print(f"[dim]round {r + 1}/{rounds}: " + ", ".join(
                    f"{m} {cpu_pairs[m][-1]:+.1%} CPU" for m in others) + "[/dim]")
            exported = received[0]
    finally:
        shutil.rmtree(base, ignore_errors=True)

    cpu_cost = {m: spread(v) for m, v in cpu_pairs.items()}
    costs = {m: spread(v) for m, v in rate_pairs.items()}
    table = Table(title=f"Observability cost (five-notice sessions, concurrency {CONCURRENCY}; "
                        f"{rounds} rounds of {per_round} sessions per mode, each run "
                        f"paired with its round's off run; every mode {per_epoch} rounds "
                        "on each stack)", title_justify="left")
    for col in ("mode", "CPU ms/session", "cost (CPU, paired)", "sessions/s",
                "cost (sessions/s, paired)", "target"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for mode in rates:
        table.add_row(mode, f"{statistics.median(cpu_ms[mode]):.2f}",
                      describe(cpu_cost[mode]) if mode in cpu_cost else "",
                      f"{statistics.median(rates[mode]):.1f}",
                      describe(costs[mode]) if mode in costs else "",
                      f"<= {TARGET_COST:.0%}" if mode == "shipped"
                      else "~0 (the bench's bias)" if mode == CONTROL else "")
    console.print(table)
    roles = sorted({r for by in role_pairs.values() for r in by})
    split = Table(title="Where the cost is: CPU µs per session over the round's off run, "
                        "by process (medians of the rounds' pairs)", title_justify="left")
    split.add_column("mode")
    for role in roles:
        split.add_column(role, justify="right")
    for mode, by in role_pairs.items():
        split.add_row(mode, *(f"{statistics.median(by[r]) * 1000:+.0f}" if by.get(r) else ""
                              for r in roles))
    console.print(split)
    console.print(f"[dim]medians of the {rounds} rounds' paired costs; in brackets a 95% "
                  "confidence interval of the median and the interquartile range (min..max in "
                  f"the JSON). '{CONTROL}' is the off configuration as a mode of its own: a cost "
                  "within its distance from zero is not told apart from nothing. OTLP bytes "
                  f"exported: {exported:,}; shipped sampler: {SHIPPED_SAMPLER}[/dim]")
    rows = [Row(mode=mode, operation=f"sessions c={CONCURRENCY}", writers=CONCURRENCY,
                n=rounds * per_round, p50_us=float("nan"), p99_us=float("nan"),
                ops_per_s=statistics.median(rates[mode]), note="median of rounds")
            for mode in rates]
    extra = {"rates": rates, "costs": costs, "cpu_ms_per_session": cpu_ms,
             "cpu_costs": cpu_cost, "cpu_pairs": cpu_pairs, "rate_pairs": rate_pairs,
             "target": TARGET_COST, "rounds": rounds, "rounds_per_stack": per_epoch,
             "sessions_per_round": per_round, "otlp_bytes": exported,
             "shipped_sampler": SHIPPED_SAMPLER, "control": CONTROL,
             "process_us_per_session": {
                 mode: {r: statistics.median(v) * 1000 for r, v in by.items()}
                 for mode, by in role_pairs.items()}}
    return Result(NAME, rows, env=environment(), extra=extra)
