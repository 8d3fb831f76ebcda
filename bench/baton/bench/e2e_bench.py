"""End to end: Baton's tool round trip and five-notice sessions on the real services.

One :class:`~baton.devkit.devstack.DevStack` (redis-server, nats-server, the mail service
without delay, one Brain, one Hands, one Relay, each its own OS process; non-durable
servers) serves the whole run, and on the same servers, in the same run:

1. **raw chain**: the hop chain of ``bench chain`` (Lua commit -> relay -> JetStream -> pull
   fetch -> Lua commit -> ack), the floor each leg of a tool round trip stands on;
2. **tool round trip, driven** (:mod:`baton.bench.driven_brain`): this process plays the
   Brain for sessions of a second agent (``rtt``, its own wake consumer) with Baton's own
   code (``Generation`` phases, ``Store``, ``Bus``) while the stack's Relay and Hands serve
   it: from the start of the commit of one tool intent to the return of the ``load`` after
   the wake (intent commit -> relay -> NATS -> Hands fetch -> claim -> tool -> complete +
   wake row -> relay -> NATS -> wake fetch -> acquire -> load), timed with
   ``perf_counter``, minus the tool's own ``duration_ms``;
3. **tool round trip, real Brain**: one-address sessions of the stack's Brain, from the
   receipts (millisecond timestamps): the ``tools`` commit to the Brain's next receipt;
4. **five notices**: sessions/s and submit -> settled latency at concurrency 1, 8 and 32,
   with CPU seconds per session of every process, Redis commands per session, and the
   traffic per session: NATS messages and bytes in and out, Redis bytes in and out;
5. **baselines**, the same workload on the same mail service: a plain in-process loop with a
   JSONL log (:mod:`baton.bench.plain_loop`, what the targets divide by) and an in-process
   LangGraph agent with a SQLite checkpointer (:mod:`baton.bench.langgraph_peer`, the peer a
   user would pick instead; skipped with a hint when LangGraph is not installed), each
   measured before and again after Baton's sessions (:mod:`baton.bench.baselines`), so that a
   machine drifting during the run moves both sides of a ratio alike.

Targets, each a ratio to a baseline of the same run: tool round trip <= 2x the raw chain (it
holds two chains: dispatch and wake); sessions/s at concurrency 32 >= 40% of the plain loop's;
p50 at concurrency 1 <= 2.5x the plain loop's; CPU per step at concurrency 32 <= 1.5 ms and
below the LangGraph agent's. The machine has 2 cores for 9+ processes: the load average is
recorded.
Figures, not assertions: tables on stdout and ``bench/results/e2e.json``.

``bench durable`` (:mod:`baton.bench.durable_bench`) is the same run on durable servers:
Redis with ``appendfsync always``, JetStream with ``sync_interval: always``, and every
baseline as durable (the plain loop's log fsync'd at each step, SQLite's ``synchronous=FULL``
for LangGraph), without the scale-out pass: what a write that survives a power cut costs
each contender (``bench/results/durable.json``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from baton.bench import chain_bench, langgraph_peer, plain_loop
from baton.bench.common import (
    Result,
    Row,
    environment,
    io_calls,
    percentile,
    print_rows,
    process_cpu_s,
)
from baton.bench.driven_brain import ONE, DrivenBrain
from baton.bench.floors import floors
from baton.bench.sessions import FIVE, STEPS, bench_client, sessions
from baton.client import Client
from baton.devkit.devstack import DevStack
from baton.receipts import CommitDetail
from baton.store.store import Store

NAME = "e2e"
DURABLE = "durable"  # the name of the run on durable servers (baton.bench.durable_bench)
DESCRIPTION = "tool round trip vs the raw chain, five-notice sessions/s and latency (DevStack)"

TARGET_RTT_CHAINS = 2.0  # tool round trip <= 2x the raw chain p50
# Against the plain in-process loop (bench.plain_loop) measured in the same run:
TARGET_C32_OF_PLAIN = 0.40  # sessions/s at concurrency 32 >= 40% of the plain loop's
TARGET_C1_X_PLAIN = 2.5  # p50 at concurrency 1 <= 2.5x the plain loop's
# CPU per step at concurrency 32 of Baton's own processes (Brain, Hands, relay, Redis, NATS).
# The mail service is the outside world, the same for every contender, and the bench client
# stands in for the application: both are printed apart, never hidden.
TARGET_CPU_PER_STEP_MS = 1.5
OUTSIDE = frozenset({"mailbox", "bench client"})
SERVERS = frozenset({"redis", "nats"})


@dataclass(frozen=True)
class Config:
    chain: chain_bench.Config = field(
        default_factory=lambda: chain_bench.Config(chains=500, warmup=50, flows=32,
                                                   per_flow=50))
    rtt_n: int = 200
    rtt_warmup: int = 20
    brain_rtt_n: int = 60
    c1_n: int = 100
    c1_warmup: int = 10
    # (concurrency, sessions)
    levels: tuple[tuple[int, int], ...] = ((8, 120), (32, 256), (128, 512))
    scale_out: bool = True  # the session levels again with two brains and two hands


QUICK = Config(chain=replace(chain_bench.QUICK, flows=32, per_flow=20), rtt_n=40, rtt_warmup=5,
               brain_rtt_n=15, c1_n=20, c1_warmup=3, levels=((8, 32), (32, 64), (128, 128)))


# ---------------------------------------------------------------------------- process CPU


class CpuMeter:
    """CPU seconds per process of the stack (and this one, the client) over a section."""

    def __init__(self, stack: DevStack) -> None:
        self.pids = {p["name"]: p["pid"] for p in stack.processes}
        self.pids["bench client"] = os.getpid()

    def read(self) -> dict[str, float]:
        return {name: process_cpu_s(pid) for name, pid in self.pids.items()}

    def read_io(self) -> dict[str, tuple[int, int]]:
        """The read and write system calls so far (see :func:`io_calls`) of each process
        whose socket I/O they are: not of :data:`IO_UNSEEN`."""
        return {name: io_calls(pid) for name, pid in self.pids.items()
                if name not in IO_UNSEEN}


#: Processes whose socket I/O /proc/PID/io does not count: it counts read() and write()
#: calls, which Redis, nats-server and libuv (Baton's services on uvloop) make, while
#: asyncio's own loop (the mail service, this process) sends and receives with send() and
#: recv().
IO_UNSEEN = frozenset({"mailbox", "bench client"})


async def redis_calls(store: Store) -> Counter[str]:
    stats = await store.redis.info("commandstats")
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})


async def traffic(stack: DevStack, store: Store) -> Counter[str]:
    """What went over the wire so far: NATS messages and bytes in and out (nats-server's
    ``/varz``) and the bytes Redis read and wrote (``INFO stats``), cumulative."""
    out: Counter[str] = Counter()
    stats = await store.redis.info("stats")
    out["redis_bytes_in"] = int(stats.get("total_net_input_bytes", 0))
    out["redis_bytes_out"] = int(stats.get("total_net_output_bytes", 0))
    nats = stack.servers.nats if stack.servers is not None else None
    if nats is not None and nats.monitor_port:
        async with httpx.AsyncClient(timeout=5.0) as http:
            varz = (await http.get(f"http://{nats.host}:{nats.monitor_port}/varz")).json()
        for key in ("in_msgs", "out_msgs", "in_bytes", "out_bytes"):
            out[f"nats_{key}"] = int(varz.get(key, 0))
    return out


# ---------------------------------------------------------------------------- sessions


async def brain_round_trips(client: Client, n: int) -> list[dict[str, float]]:
    """One-address sessions of the real Brain; legs from the receipts (ms resolution)."""
    out = []
    for _ in range(n):
        sub, _ = await client.submit(ONE, agent="notices")
        final = await client.wait(sub, timeout=30)
        if final.status != "completed":
            raise RuntimeError(f"session {sub.session_id} ended {final.status}: {final.error}")
        receipts = await client.store.receipts(sub.session_id)  # in commit order
        tools = next(r for r in receipts
                     if isinstance(r.detail, CommitDetail) and r.detail.step == "tools")
        claim = next(r for r in receipts if r.kind == "claim")
        k, complete = next((k, r) for k, r in enumerate(receipts) if r.kind == "complete")
        after = next(r for r in receipts[k + 1:] if r.worker and r.worker.role == "brain")
        run = (await client.store.runs.applied(sub.session_id)).popitem()[1]
        tool_ms = run.result.duration_ms if run.result else 0.0
        out.append({"total_ms": after.ts_ms - tools.ts_ms, "tool_ms": tool_ms,
                    "dispatch_ms": claim.ts_ms - tools.ts_ms,
                    "wake_ms": after.ts_ms - complete.ts_ms})
    return out


# ---------------------------------------------------------------------------- report


def _us(samples: list[float]) -> tuple[float, float]:
    return percentile(samples, 50), percentile(samples, 99)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


async def session_levels(stack: DevStack, client: Client, cfg: Config, mode: str
                         ) -> tuple[dict[int, Row], dict[str, dict[str, Any]]]:
    """Five-notice sessions at each concurrency level: rows and per-level CPU and commands."""
    meter = CpuMeter(stack)
    per_level: dict[str, dict[str, Any]] = {}
    levels = [(1, cfg.c1_n, cfg.c1_warmup), *[(c, n, 1) for c, n in cfg.levels]]
    session_rows: dict[int, Row] = {}
    for conc, total, warmup in levels:
        # The CPU meters bracket the sessions alone: the readings around them (an INFO, a
        # /varz over a new HTTP client) cost the bench client milliseconds of CPU each.
        before_wire = await traffic(stack, client.store)
        before_calls = await redis_calls(client.store)
        before_io, before_cpu = meter.read_io(), meter.read()
        run_ = await sessions(client, conc, total, warmup)
        after_cpu, after_io = meter.read(), meter.read_io()
        after_calls = await redis_calls(client.store)
        wire = await traffic(stack, client.store)
        wire.subtract(before_wire)
        n = len(run_.samples_ns) + warmup * conc  # the meters saw the warm-up too
        row = Row.from_run(mode, "five notices, submit -> settled", run_, writers=conc)
        row.client_cpu_us = None
        session_rows[conc] = row
        calls = after_calls - before_calls
        calls["info"] = 0
        per_level[f"c={conc}"] = {
            "sessions": len(run_.samples_ns),
            "sessions_per_s": row.ops_per_s,
            "p50_ms": row.p50_us / 1000,
            "p99_ms": row.p99_us / 1000,
            "cpu_ms_per_session": {k: (after_cpu[k] - before_cpu[k]) * 1000 / n
                                   for k in before_cpu},
            # Reads and writes (socket receives and sends among them) per session: how
            # much of a process's work the batching of concurrent sessions already shares.
            "io_calls_per_session": {k: [(after_io[k][i] - before_io[k][i]) / n for i in (0, 1)]
                                     for k in before_io},
            "redis_calls_per_session": sum(calls.values()) / n,
            "redis_calls_by_command": {k: round(v / n, 2) for k, v in calls.most_common()},
            # the readings themselves (an INFO, a /varz) are a few hundred bytes a level
            "wire_per_session": {k: v / n for k, v in sorted(wire.items())},
            "loadavg": os.getloadavg()[0],
        }
    return session_rows, per_level


async def scale_out(cfg: Config, console: Console) -> tuple[dict[int, Row], dict[str, Any]]:
    """The session levels on a stack with two brains and two hands (does it scale out?)."""
    base = Path(tempfile.mkdtemp(prefix="baton-e2e2-"))
    try:
        async with DevStack(base, brains=2, hands=2, relays=1, mail_delay_ms=0,
                            durable=False, namespace="bench", mail_persist=False) as stack:
            client = await bench_client(stack)
            try:
                return await session_levels(stack, client, cfg, "2 brains, 2 hands")
            finally:
                await client.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------------------- run


async def run(quick: bool = False, console: Console | None = None, *,
              durable: bool = False) -> Result:
    """The run on non-durable servers, or (``durable``) on servers that fsync every write,
    its baselines fsync'ing theirs, as ``bench durable`` (no scale-out pass then)."""
    console = console or Console()
    cfg = QUICK if quick else Config()
    if durable:
        cfg = replace(cfg, scale_out=False)
    env = environment()
    started = time.perf_counter()
    base = Path(tempfile.mkdtemp(prefix="baton-e2e-"))
    rows: list[Row] = []
    extra: dict[str, Any] = {"config": asdict(cfg), "durable": durable}
    try:
        # The mail service keeps its operations in memory here (no fsync per mail), durable
        # run or not: it is the outside world, the same for every contender.
        async with DevStack(base, brains=1, hands=1, relays=1, mail_delay_ms=0,
                            durable=durable, namespace="bench", mail_persist=False) as stack:
            console.print("[dim]stack: " + ", ".join(
                f"{p['name']} {p['pid']}" for p in stack.processes)
                + ("; durable: every write fsync'd by Redis and JetStream, and by the "
                   "baselines" if durable else "; non-durable servers") + "[/dim]")
            client = await bench_client(stack)
            try:
                await _run_stack(stack, client, cfg, console, rows, extra, durable)
            finally:
                await client.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if cfg.scale_out:
        scaled, per_level = await scale_out(cfg, console)
        rows.extend(scaled.values())
        extra["sessions_scaled"] = per_level
        one = {int(k[2:]): v for k, v in extra["sessions"].items()}
        print_rows("Five-notice sessions with 2 brains and 2 hands (ops/s = sessions/s)",
                   list(scaled.values()), console)
        console.print("[dim]scale-out, sessions/s with 2 brains + 2 hands vs 1 + 1: " + ", ".join(
            f"c={c} {r.ops_per_s / one[c]['sessions_per_s']:.2f}x" for c, r in scaled.items())
            + f" (one machine of {os.cpu_count()} cores for every process)[/dim]")
    extra["loadavg_after"] = os.getloadavg()
    elapsed = time.perf_counter() - started
    extra["elapsed_s"] = round(elapsed, 2)
    console.print(f"[dim]load average before {env['loadavg_1m']:.2f}, after "
                  f"{extra['loadavg_after'][0]:.2f} (1 min); {os.cpu_count()} cores; "
                  f"{elapsed:.1f} s[/dim]")
    return Result(DURABLE if durable else NAME, rows, env=env, extra=extra)


async def _run_stack(stack: DevStack, client: Client, cfg: Config, console: Console,
                     rows: list[Row], extra: dict[str, Any], durable: bool) -> None:
    # 1. The raw chain on the same servers, while the services idle.
    # The servers' CPU is read beside this process's, so a chain's whole cost is known.
    servers = [p["pid"] for p in stack.processes if p["name"] in SERVERS]

    async def servers_cpu() -> float:
        return sum(process_cpu_s(pid) for pid in servers)

    chain_rows = await chain_bench.measure(stack.redis_url, stack.nats_url, cfg.chain,
                                           mode="raw", hops=("commit",), probe=servers_cpu)
    rows.extend(chain_rows)
    commit_row, chain_row, flows_row = chain_rows
    chain_p50 = chain_row.p50_us

    # 2. The tool round trip, this process as the Brain: with a hold (as shipped) and the
    # released way (holds off) alternately, so both see the same machine.
    driven = await DrivenBrain.open(client)
    ways = [True, False] if driven.can_hold else [False]
    try:
        for i in range(cfg.rtt_warmup):
            await driven.once(i, hold=ways[i % len(ways)])
        driven.samples.clear()
        wall0 = time.perf_counter()
        for i in range(cfg.rtt_n * len(ways)):
            await driven.once(i, hold=ways[i % len(ways)])
        wall = time.perf_counter() - wall0
    finally:
        await driven.close()
    by_way = {way: [x for x in driven.samples if bool(x["held"]) == way] for way in ways}
    nets: dict[bool, list[float]] = {}
    for way, s in by_way.items():
        net = nets[way] = [x["total_us"] - x["tool_us"] for x in s]
        mode = "driven, hold" if way else "driven, released"
        for label, values in [
                ("tool round trip, net of the tool", net),
                ("  gross (incl. tool)", [x["total_us"] for x in s]),
                ("  the tool's own time (duration_ms)", [x["tool_us"] for x in s]),
                ("  intent commit (Generation._dispatch)", [x["commit_us"] for x in s]),
                ("  release + reads after the word" if way
                 else "  lease and its reads after the wake", [x["acquire_load_us"] for x in s])]:
            p50, p99 = _us(values)
            rows.append(Row(mode=mode, operation=label, writers=1, n=len(values), p50_us=p50,
                            p99_us=p99, ops_per_s=len(driven.samples) / wall,
                            ratio=p50 / chain_p50))
    shipped = ways[0]  # a hold when the settings hold, as a Brain of the stack does
    s = by_way[shipped]
    net = nets[shipped]
    legs: dict[str, Any] = {
        "way": "hold" if shipped else "released",
        "commit_to_claim_ms_mean": _mean([x["to_claim_ms"] for x in s]),
        "commit_to_complete_ms_mean": _mean([x["to_complete_ms"] for x in s]),
        "total_ms_mean": _mean([x["total_us"] / 1000 for x in s]),
        "tool_ms_mean": _mean([x["tool_us"] / 1000 for x in s]),
    }
    if len(ways) == 2:
        legs["released_net_p50_us"] = percentile(nets[False], 50)
    legs["results_before_release"] = driven.early
    legs["held_commits_that_did_not_hold"] = driven.unheld
    extra["driven_round_trip_legs"] = legs

    # 3. The same with the stack's own Brain, from its receipts.
    brain = await brain_round_trips(client, cfg.brain_rtt_n)
    for key in ("total_ms", "tool_ms", "dispatch_ms", "wake_ms"):
        extra.setdefault("brain_round_trip", {})[f"{key}_mean"] = _mean([b[key] for b in brain])
    brain_net = [(b["total_ms"] - b["tool_ms"]) * 1000 for b in brain]
    p50, p99 = _us(brain_net)
    rows.append(Row(mode="real brain", operation="tool round trip, net (receipts, ms steps)",
                    writers=1, n=len(brain_net), p50_us=p50, p99_us=p99, ops_per_s=float("nan"),
                    ratio=_mean(brain_net) / chain_p50, note=f"mean {_mean(brain_net):,.0f}"))

    # 4. Five-notice sessions, with the same workload in this process as baselines, a pass
    # of them before and another after Baton's (baton.bench.baselines): a plain loop, and
    # an in-process LangGraph agent checkpointing to SQLite, the peer "below in-process
    # LangGraph" names, measured here rather than quoted.
    total32 = dict(cfg.levels).get(32, 64)
    mail_pid = stack.mailbox.pid if stack.mailbox is not None else None
    base_levels = [(1, cfg.c1_n, cfg.c1_warmup), (32, total32, 1)]
    if not langgraph_peer.available():
        console.print(f"[yellow]LangGraph is not installed: the in-process peer is skipped "
                      f"({escape(langgraph_peer.INSTALL_HINT)})[/yellow]")
    async with contextlib.AsyncExitStack() as opened:
        baselines = [await opened.enter_async_context(
            plain_loop.opened(stack.mail_url, FIVE, fsync=durable))]
        if langgraph_peer.available():
            baselines.append(await opened.enter_async_context(
                langgraph_peer.opened(stack.mail_url, FIVE, fsync=durable)))
        # This process drives every contender's sessions (Baton's client, the plain loop and
        # LangGraph run here) and holds what all of them imported: a full collection of that
        # heap took 105-155 ms, about once per level, which a level of a few dozen sessions
        # counted at 1.5-2 ms per session, to whichever contender it fell on. Frozen, as
        # Baton's services freeze theirs once started (baton.service), full collections
        # scan only what the sessions themselves keep.
        gc.collect()
        gc.freeze()
        for baseline in baselines:
            await baseline.run(base_levels, mail_pid)
        session_rows, per_level = await session_levels(stack, client, cfg, "1 brain, 1 hands")
        for baseline in baselines:
            await baseline.run(base_levels, mail_pid)
    rows.extend(session_rows.values())
    extra["sessions"] = per_level
    plain_rows, plain_cpu = baselines[0].rows(), baselines[0].cpu()
    rows.extend(plain_rows.values())
    extra["plain_loop"] = baselines[0].figures()
    peer_rows: dict[int, Row] = {}
    peer_cpu: dict[int, dict[str, float]] = {}
    if len(baselines) > 1:
        peer_rows, peer_cpu = baselines[1].rows(), baselines[1].cpu()
        rows.extend(peer_rows.values())
        extra["langgraph"] = baselines[1].figures()
    else:
        extra["langgraph"] = {"skipped": langgraph_peer.INSTALL_HINT}

    print_rows("End to end (µs; ratio = p50 / raw chain p50 at one flow; sessions: ops/s = "
               "sessions/s)", rows, console)
    console.print(f"[dim]driven round trip legs, {legs['way']} (means, ms; Redis receipts "
                  f"vs this clock): "
                  f"commit->claim {legs['commit_to_claim_ms_mean']:.2f}, commit->complete "
                  f"{legs['commit_to_complete_ms_mean']:.2f}, total "
                  f"{legs['total_ms_mean']:.2f}, tool {legs['tool_ms_mean']:.2f}[/dim]")
    b = extra["brain_round_trip"]
    console.print(f"[dim]real Brain (means, ms): tools commit->claim {b['dispatch_ms_mean']:.2f}"
                  f", complete->next Brain receipt {b['wake_ms_mean']:.2f}, total "
                  f"{b['total_ms_mean']:.2f}, tool {b['tool_ms_mean']:.2f}[/dim]")
    print_cpu(per_level, console)

    rtt_p50 = percentile(net, 50)
    c32 = session_rows.get(32)
    c1 = session_rows[1]
    p1, p32 = plain_rows[1], plain_rows[32]
    tool_p50 = percentile([x["tool_us"] for x in s], 50)
    extra.update(floors(chain_row, flows_row, commit_row, tool_p50, c1, p1, p32,
                        plain_cpu.get(32), console, c1_target=TARGET_C1_X_PLAIN,
                        c32_target=TARGET_C32_OF_PLAIN))
    targets = [
        {"figure": "tool round trip p50 (net) / raw chain p50",
         "measured": f"{rtt_p50:,.0f} µs = {rtt_p50 / chain_p50:.2f} chains ({legs['way']}"
                     + (f"; released {legs['released_net_p50_us'] / chain_p50:.2f} chains)"
                        if "released_net_p50_us" in legs else ")"),
         "target": f"<= {TARGET_RTT_CHAINS:.0f} chains ({TARGET_RTT_CHAINS * chain_p50:,.0f} µs)",
         "ratio_value": rtt_p50 / chain_p50,
         "met": rtt_p50 <= TARGET_RTT_CHAINS * chain_p50},
        {"figure": "five notices p50 at concurrency 1 / plain loop p50",
         "measured": f"{c1.p50_us / p1.p50_us:.2f}x ({c1.p50_us / 1000:.1f} vs "
                     f"{p1.p50_us / 1000:.1f} ms; the design's hops and commits in a row "
                     f"alone {extra['c1_floor']['design_floor_x_plain']:.2f}x)",
         "target": f"<= {TARGET_C1_X_PLAIN}x", "ratio_value": c1.p50_us / p1.p50_us,
         "met": c1.p50_us / p1.p50_us <= TARGET_C1_X_PLAIN},
    ]
    if c32 is not None:
        share = c32.ops_per_s / p32.ops_per_s
        targets.append({
            "figure": "five notices sessions/s at concurrency 32 / plain loop",
            "measured": f"{share:.0%} ({c32.ops_per_s:.0f} vs {p32.ops_per_s:.0f}/s"
                        + (f"; the design's relayed messages alone allow "
                           f"{extra['c32_ceiling']['of_plain']:.0%})"
                           if "c32_ceiling" in extra else ")"),
            "target": f">= {TARGET_C32_OF_PLAIN:.0%}", "ratio_value": share,
            "met": share >= TARGET_C32_OF_PLAIN})
        level = per_level["c=32"]["cpu_ms_per_session"]
        stack_cpu = sum(v for k, v in level.items() if k not in OUTSIDE)
        plain = plain_cpu[32]
        per_step = stack_cpu / STEPS
        targets.append({
            "figure": f"CPU per step at concurrency 32, Brain + Hands + relay + Redis + NATS "
                      f"({STEPS} steps/session)",
            "measured": f"{per_step:.2f} ms = {stack_cpu / plain['loop']:.1f}x the plain "
                        f"loop's ({stack_cpu:.1f} vs {plain['loop']:.1f} ms/session; the mail "
                        f"service {level.get('mailbox', 0.0):.1f} vs {plain['mailbox']:.1f} apart)",
            "target": f"<= {TARGET_CPU_PER_STEP_MS} ms", "ratio_value": stack_cpu / plain["loop"],
            "met": per_step <= TARGET_CPU_PER_STEP_MS})
        # Beside LangGraph, whose process also drives its sessions, Baton's side counts the
        # client that submits and waits too (the bench client: the application's side).
        targets.extend(langgraph_peer.figures(
            (stack_cpu + level.get("bench client", 0.0)) / STEPS, c1, c32, peer_rows, peer_cpu,
            steps=STEPS, mail_ms=level.get("mailbox", 0.0)))
    print_targets(targets, console)
    extra["targets"] = targets


# ---------------------------------------------------------------------------- tables


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
