"""Store benchmark: PING round trip vs fenced ``Store.commit``, fast and durable Redis.

For each durability mode (fast: no AOF; durable: AOF with ``appendfsync always``) a private
``redis-server`` is started in a temp dir, and the same run measures:

* ``PING``: the raw redis-py asyncio round trip, the floor every commit pays, and ``INCR``,
  the smallest write (in durable mode: the round trip plus one AOF fsync);
* a small commit (1 entry + 1 task update + deadline) and a "tools" commit (the five-notice
  dispatch: 1 model entry with 5 tool calls, 5 ToolIntents, 5 outbox rows, the task moved to
  waiting, a group, the deadline), sequential at one writer;
* the same commits at 16 concurrent writers (16 sessions) sharing one Store, and the tools
  commit with one Store (one connection pool) per writer;
* where one commit's time goes (see :func:`split`): PING, a no-op script with the same
  arguments, the commit script with a pre-serialized write-set and ``Store.commit``, run
  interleaved, plus ``Writes.to_script`` alone and the server's own script time.
The client's and the server's CPU per operation (``process_time``, ``INFO cpu``) say which
side bounds the throughput.

Every writer has its own session and holds its lease (acquired first), as a Brain does.
Figures, not assertions: a table on stdout and ``bench/results/store.json``.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis.utils
from rich.console import Console
from rich.table import Table

from baton.bench.common import (
    Result,
    Row,
    concurrent,
    environment,
    percentile,
    print_rows,
    sequential,
)
from baton.devkit.servers import RedisServer
from baton.models import (
    Checkpoint,
    Entry,
    OutboxRow,
    Running,
    Task,
    ToolCall,
    ToolDispatch,
    ToolIntent,
    Usage,
    Waiting,
)
from baton.settings import Settings
from baton.store.scripts import declared
from baton.store.store import Store, now_ms, worker_ref
from baton.store.writes import Writes

NAME = "store"
DESCRIPTION = "PING vs fenced Store.commit latency and throughput, fast and durable Redis"

MODES = {"fast": False, "durable": True}
WAKE = "bench.wake.notices.1"
TOOL_SUBJECT = "bench.tool.send_email"
LEASE_MS = 600_000  # longer than the run: the benchmark never loses its lease
DEADLINE_MS = 15_000  # what the Brain arms while a task is live
BRAIN = worker_ref("brain", "bench-brain")
BODY = (
    "Dear tenant, the water supply of your building will be interrupted on Tuesday between "
    "9:00 and 13:00 for scheduled maintenance of the main riser. Please store enough water "
    "for the morning. We apologise for the inconvenience. -- Building management"
)


@dataclass(frozen=True)
class Config:
    ping_n: int = 5_000
    commit_n: int = 3_000
    warmup: int = 300
    writers: int = 16
    per_writer: int = 300  # timed commits per concurrent writer
    writer_warmup: int = 20
    split_n: int = 1_000  # rounds of the interleaved breakdown


QUICK = Config(ping_n=1_000, commit_n=500, warmup=100, per_writer=60, writer_warmup=10,
               split_n=200)


# ---------------------------------------------------------------------------- write-sets


def generation_task(session: str) -> Task:
    return Task(id=f"task-{session}", kind="generation", owner=session,
                submission_id=f"sub-{session}", input={"text": "send the five notices"})


def small_writes(task: Task, i: int) -> Writes:
    """One model entry and one task update: the smallest commit a phase makes."""
    now = now_ms()
    entry = Entry(kind="model", text=f"Thinking about step {i}.", task_id=task.id,
                  submission_id=task.submission_id, usage=Usage(input_tokens=812,
                                                                output_tokens=24), ts_ms=now)
    updated = task.model_copy(update={
        "state": Running(worker=BRAIN.name, fence=1, since_ms=now),
        "checkpoint": Checkpoint(phase="request", data={"turn": i + 1, "model": "scripted"}),
        "updated_ms": now,
    })
    return Writes(kind="request", entries=[entry], tasks=[updated], deadline_ms=DEADLINE_MS,
                  detail={"task_id": task.id, "turn": i + 1})


def tools_writes(session: str, task: Task, i: int, tools: int = 5) -> Writes:
    """The "tools" commit of a five-notice session, as ``baton.brain.generation`` builds it."""
    now = now_ms()
    group = f"{task.id}-{i}"
    calls = tuple(
        ToolCall(id=f"call-{i}-{k}", name="send_email",
                 arguments={"to": f"tenant{k}@example.com", "subject": "Water interruption",
                            "body": BODY})
        for k in range(tools)
    )
    entry = Entry(kind="model", text="Sending the five notices now.", tool_calls=calls,
                  task_id=task.id, submission_id=task.submission_id,
                  usage=Usage(input_tokens=1_420, output_tokens=610), ts_ms=now)
    writes = Writes(kind="tools", entries=[entry], deadline_ms=DEADLINE_MS)
    for k, call in enumerate(calls):
        run_id = f"{group}-{k}"
        intent = ToolIntent(
            run_id=run_id, session_id=session, task_id=task.id, tool=call.name,
            arguments=call.arguments, replay="confirm", operation_id=f"{session}:{run_id}",
            tool_call_id=call.id, wake_subject=WAKE, group=group, created_ms=now,
        )
        writes.runs.append(intent)
        msg = ToolDispatch(session_id=session, run_id=run_id, tool=call.name)
        writes.outbox.append(OutboxRow(subject=TOOL_SUBJECT, data=msg.to_json()))
    writes.groups[group] = tools
    writes.tasks.append(task.model_copy(update={
        "state": Waiting(on=tuple(r.run_id for r in writes.runs)),
        "checkpoint": Checkpoint(phase="apply", data={"turn": i + 1, "group": group}),
        "updated_ms": now,
    }))
    writes.detail = {"task_id": task.id, "turn": i + 1, "runs": [r.run_id for r in writes.runs]}
    return writes


def build(kind: str, session: str, task: Task, count: int) -> list[Writes]:
    # Built before timing: making the models is the Brain's work, serializing them is the
    # commit's (Store.commit calls Writes.to_script).
    if kind == "small":
        return [small_writes(task, i) for i in range(count)]
    return [tools_writes(session, task, i) for i in range(count)]


# ---------------------------------------------------------------------------- sessions


@dataclass
class Writer:
    """One session under lease with its pre-built write-sets."""

    store: Store
    session: str
    fence: int
    writes: list[Writes]

    async def commit(self, i: int) -> None:
        await self.store.commit(self.session, self.fence, self.writes[i], BRAIN)


async def open_writer(store: Store, session: str, kind: str, count: int) -> Writer:
    task = generation_task(session)
    await store.inbox.submit(session, agent="notices", compat=1, wake_subject=WAKE,
                             request_id=f"req-{session}", text="send the five notices", task=task,
                             worker=worker_ref("client", "bench"), submission_id=f"sub-{session}")
    lease = await store.acquire(session, BRAIN, LEASE_MS)
    return Writer(store, session, lease.fence, build(kind, session, task, count))


# ---------------------------------------------------------------------------- measurements


async def server_cpu_s(store: Store) -> float:
    """The server's CPU seconds so far (user + system), read from ``INFO cpu``."""
    info = await store.redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def evalsha_usec(store: Store, command: str = "evalsha") -> float:
    """The server's own mean time per ``command`` (EVALSHA, FCALL) since the last
    ``CONFIG RESETSTAT``."""
    stats = await store.redis.info("commandstats")
    return float(stats.get(f"cmdstat_{command}", {}).get("usec_per_call", 0.0))


async def run_mode(
    mode: str, cfg: Config, console: Console
) -> tuple[list[Row], dict[str, dict[str, Any]]]:
    rows: list[Row] = []
    breakdown: dict[str, dict[str, Any]] = {}
    async with RedisServer(durable=MODES[mode]) as server:
        settings = Settings(redis_url=server.url, namespace="bench")
        store = await Store.connect(settings)
        extra_stores: list[Store] = []

        async def probe() -> float:
            return await server_cpu_s(store)

        try:
            console.print(f"[dim]{mode}: redis-server pid {server.pid}, port {server.port}[/dim]")
            r = store.redis
            ping = await sequential(lambda _: r.ping(), cfg.ping_n, cfg.warmup, probe)
            ping_row = Row.from_run(mode, "PING", ping)
            rows.append(ping_row)
            # The smallest write: in durable mode, the round trip plus one AOF fsync.
            incr = await sequential(lambda _: r.incr("bench:incr"), cfg.commit_n, cfg.warmup,
                                    probe)
            rows.append(Row.from_run(mode, "INCR (smallest write)", incr))

            for kind in ("small", "tools"):
                w = await open_writer(store, f"seq-{kind}", kind, cfg.warmup + cfg.commit_n)
                run = await sequential(w.commit, cfg.commit_n, cfg.warmup, probe)
                rows.append(Row.from_run(mode, f"commit {kind}", run))

            for kind in ("small", "tools"):
                breakdown[kind] = await split(store, kind, cfg)
                breakdown[kind]["data_dir_fs"] = filesystem_of(server.data_dir)

            for kind in ("small", "tools"):
                writers = [
                    await open_writer(store, f"conc-{kind}-{k}", kind,
                                      cfg.writer_warmup + cfg.per_writer)
                    for k in range(cfg.writers)
                ]
                rows.append(await concurrent_row(mode, kind, writers, cfg, probe,
                                                 "one shared Store"))
            extra_stores = [await Store.connect(settings) for _ in range(cfg.writers)]
            writers = [
                await open_writer(s, f"own-tools-{k}", "tools", cfg.writer_warmup + cfg.per_writer)
                for k, s in enumerate(extra_stores)
            ]
            rows.append(await concurrent_row(mode, "tools", writers, cfg, probe,
                                             "a Store per writer"))
        finally:
            for s in extra_stores:
                await s.close()
            await store.close()

    for row in rows:
        if row.writers == 1:
            row.ratio = row.p50_us / ping_row.p50_us
    return rows, breakdown


async def concurrent_row(mode: str, kind: str, writers: list[Writer], cfg: Config,
                         probe: Callable[[], Awaitable[float]], note: str) -> Row:
    run = await concurrent([w.commit for w in writers], cfg.per_writer, cfg.writer_warmup, probe)
    return Row.from_run(mode, f"commit {kind}", run, writers=len(writers), note=note)


async def split(store: Store, kind: str, cfg: Config) -> dict[str, Any]:
    """Where one commit's time goes: the variants below run interleaved (one call of each in
    turn), so drift and noise from other processes hit them alike.

    * ``ping``: the client round trip floor;
    * ``noop_same_args``: EVALSHA of ``return 1`` with the commit's KEYS and ARGV (the cost of
      packing and shipping the arguments and of entering a script);
    * ``preserialized``: the commit script with the write-set JSON made beforehand;
    * ``store_commit``: ``Store.commit`` (adds ``Writes.to_script``, key names, checks).
    Plus ``Writes.to_script`` alone in a hot loop, and the server's own mean time per commit
    script from ``INFO commandstats``.
    """
    n = cfg.split_n
    w = await open_writer(store, f"split-{kind}", kind, cfg.warmup + 3 * n + 1)
    # As Store.commit sends it: the one declared key, an empty commit id first (no WAIT).
    keys = declared("commit", store.keys.session(w.session))
    worker_json = BRAIN.model_dump_json()
    payloads = [x.to_script() for x in w.writes]
    noop = await store.redis.script_load("return 1")
    r = store.redis
    state = {"i": 0}

    def step() -> int:
        state["i"] += 1
        return state["i"]

    async def ping() -> object:
        return await r.ping()

    async def noop_same_args() -> object:
        return await r.evalsha(noop, len(keys), *keys, "", w.fence, worker_json, w.session,
                               *payloads[state["i"]])

    async def preserialized() -> object:
        return await store.scripts.registered.commit(
            keys=keys, args=["", w.fence, worker_json, w.session, *payloads[step()]])

    async def store_commit() -> None:
        await w.commit(step())

    variants: dict[str, Callable[[], Awaitable[object]]] = {
        "ping": ping, "noop_same_args": noop_same_args,
        "preserialized": preserialized, "store_commit": store_commit,
    }
    for _ in range(cfg.warmup // 2):
        await preserialized()
        await store_commit()
    await r.config_resetstat()
    samples: dict[str, list[int]] = {name: [] for name in variants}
    gc.collect()
    clock = time.perf_counter_ns
    for _ in range(n):
        for name, call in variants.items():
            t0 = clock()
            await call()
            samples[name].append(clock() - t0)
    # The server's own means, each over calls of one script only: a difference of means
    # over mixed calls went negative when another client's script ran in the window.
    await r.config_resetstat()
    for _ in range(n):
        await noop_same_args()
    noop_us = await evalsha_usec(store)
    await r.config_resetstat()
    for _ in range(n):
        await preserialized()
    script_us = await evalsha_usec(store, "fcall")

    ser = []
    for x in w.writes[:n]:
        t0 = clock()
        x.to_script()
        ser.append(clock() - t0)
    out: dict[str, Any] = {
        f"{name}_p50_us": percentile([s / 1000 for s in ss], 50) for name, ss in samples.items()
    }
    out.update({
        "to_script_p50_us": percentile([s / 1000 for s in ser], 50),
        "server_commit_script_usec": script_us,
        "server_noop_script_usec": noop_us,
        "payload_bytes": sum(map(len, payloads[0])),
    })
    return out


def filesystem_of(path: Path) -> str:
    """The filesystem type holding ``path`` (fsync means nothing on tmpfs)."""
    best, fs = "", "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                best, fs = parts[1], parts[2]
    return fs


BREAKDOWN = [
    ("ping_p50_us", "PING round trip"),
    ("noop_same_args_p50_us", "EVALSHA 'return 1' with the commit's keys and args"),
    ("preserialized_p50_us", "commit script, write-set JSON made beforehand"),
    ("store_commit_p50_us", "Store.commit (to_script + keys + checks + script)"),
    ("to_script_p50_us", "Writes.to_script alone (hot loop)"),
    ("server_noop_script_usec", "server: 'return 1' with those args (commandstats)"),
    ("server_commit_script_usec", "server: commit script (commandstats)"),
    ("payload_bytes", "write-set arguments (bytes)"),
    ("data_dir_fs", "data dir filesystem"),
]


def print_breakdown(breakdowns: dict[str, dict[str, dict[str, Any]]], console: Console) -> None:
    table = Table(title="Where one commit's time goes (1 writer, variants interleaved; "
                        "p50 µs, server figures are means)", title_justify="left")
    table.add_column("component")
    columns = [(mode, kind) for mode, per in breakdowns.items() for kind in per]
    for mode, kind in columns:
        table.add_column(f"{mode} {kind}", justify="right")
    for key, label in BREAKDOWN:
        cells = []
        for mode, kind in columns:
            v = breakdowns[mode][kind].get(key)
            cells.append(f"{v:,.0f}" if isinstance(v, float | int) else str(v))
        table.add_row(label, *cells)
    console.print(table)


async def run(quick: bool = False, console: Console | None = None) -> Result:
    console = console or Console()
    cfg = QUICK if quick else Config()
    env = environment()
    if not redis.utils.HIREDIS_AVAILABLE:
        console.print("[yellow]hiredis is not available: figures include the pure-Python "
                      "RESP parser[/yellow]")
    if env["loadavg_1m"] > 0.5:
        console.print(f"[yellow]load average {env['loadavg_1m']:.2f}: other work on this "
                      "machine will skew the figures[/yellow]")
    rows: list[Row] = []
    breakdowns: dict[str, dict[str, dict[str, Any]]] = {}
    started = time.perf_counter()
    for mode in MODES:
        mode_rows, breakdowns[mode] = await run_mode(mode, cfg, console)
        rows.extend(mode_rows)
    elapsed = time.perf_counter() - started
    print_rows("Store: PING vs fenced commit (µs; ratio = p50 / PING p50 of the same mode)",
               rows, console)
    print_breakdown(breakdowns, console)
    console.print(f"[dim]{elapsed:.1f} s[/dim]")
    return Result(NAME, rows, env=env,
                  extra={"config": asdict(cfg), "breakdown": breakdowns,
                         "elapsed_s": round(elapsed, 2)})
