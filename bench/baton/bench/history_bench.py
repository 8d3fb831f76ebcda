"""Per-step cost as a session's history grows: a Brain step at 10, 100 and 1,000 entries.

A Brain step is ``Store.acquire_and_load`` (lease + live state + the newest page of entries,
one MULTI/EXEC) followed by a small fenced ``Store.commit`` (one entry, one task update). For
each history length, ``sessions`` sessions are filled with that many entries (one bulk commit
each, untimed), then each session takes ``steps`` timed steps, round robin, so the history
grows by a few entries at most while it is measured. A private ``redis-server`` (fast mode).

The store loads only the newest page (``entries_page``, 200 by default): from the page size
on the step cost should stay flat. A Brain holds the entries of its earlier leases
(:mod:`baton.store.entry_cache`), so a lease of a session it served before reads only the
entries appended since: the ``held`` rows, every lease on the Brain of the session's last
one (one Brain); the ``read`` rows, every lease on another Brain (a cold cache), which with
n Brains sharing a session's wakes is most of them. Target: cost at 1,000 entries <= 1.2x
that at 10, with the entries held.

A session's age (:func:`age`): one session takes up and settles ``submissions``
submissions (1,000), each with ``entries_each`` entries (10: 10,000 in all), as a Brain
does (submit, lease, the commit taking it up, entries, the commit settling it, release).
Right after the first ``young`` of them and again after the last, ``steps`` Brain steps on
its open submission are counted on the server, which a replica follows: Redis commands
(``INFO commandstats``, those a script calls included), bytes the clients sent and got
(``total_net_input_bytes``/``total_net_output_bytes``), bytes of the replication stream
(``master_repl_offset``) and the server's CPU (``used_cpu_*``) per lease+load and per
commit, beside a raw ``PING`` measured the same way in the same run. Target: each old
figure within 10% of the young one (the session's history, its settled submissions and its
receipts cost a step nothing). Streamed text (:func:`stream`): a model's answer saved every
``chunk`` characters (what 100 ms of tokens bring) through ``Store.save_partial``, for
texts of 2,000 to 32,000 characters: bytes sent and replicated per character of the text,
flat when streaming costs bytes linear in the text's length.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import asdict, astuple, dataclass
from typing import Any

from redis.asyncio import Redis
from rich.console import Console
from rich.table import Table

from baton.bench.common import Result, Row, environment, percentile, print_rows, sequential
from baton.bench.store_bench import (
    BRAIN,
    DEADLINE_MS,
    LEASE_MS,
    generation_task,
    small_writes,
)
from baton.devkit.servers import RedisServer
from baton.models import Entry, Task, Terminal
from baton.settings import Settings
from baton.store.entry_cache import EntryCache
from baton.store.store import Store, now_ms, worker_ref
from baton.store.writes import Writes

NAME = "history"
DESCRIPTION = ("Brain step (acquire+load, commit) with 10 to 1,000 history entries, and on a "
               "session of 1,000 submissions and 10,000 entries; streamed text's bytes")

SIZES = (10, 100, 200, 1_000)  # 200: the default page, from which on it is flat
TARGET_RATIO = 1.2


@dataclass(frozen=True)
class Config:
    sessions: int = 60
    steps: int = 4  # per session: history grows by at most this many while measured


QUICK = Config(sessions=20, steps=3)


async def _fill(store: Store, session: str, entries: int) -> None:
    task = generation_task(session)
    await store.inbox.submit(session, agent="notices", compat=1,
                             wake_subject="bench.wake.notices.1", request_id=f"req-{session}",
                             text="send the five notices", task=task,
                             worker=worker_ref("client", "bench"),
                             submission_id=f"sub-{session}")
    lease = await store.acquire(session, BRAIN, LEASE_MS)
    now = now_ms()
    history = [Entry(kind="model", text=f"Earlier turn {k}: sent one notice and noted the "
                     f"result.", task_id=task.id, submission_id=task.submission_id, ts_ms=now)
               for k in range(entries - 1)]  # the submit wrote the first entry
    for start in range(0, len(history), 250):  # under the payload limit per commit
        await store.commit(session, lease.fence,
                           Writes(kind="history", entries=history[start:start + 250]), BRAIN)


async def measure(store: Store, entries: int, cfg: Config, tag: str, mode: str) -> Row:
    sessions = [f"hist-{tag}-{mode}-{entries}-{k}" for k in range(cfg.sessions)]
    for s in sessions:
        await _fill(store, s, entries)
    tasks = {s: generation_task(s) for s in sessions}

    async def step(i: int) -> None:
        s = sessions[i % len(sessions)]
        lease, _state = await store.acquire_and_load(s, BRAIN, LEASE_MS)
        await store.commit(s, lease.fence, small_writes(tasks[s], i), BRAIN)

    run = await sequential(step, cfg.sessions * (cfg.steps - 1), warmup=cfg.sessions)
    return Row.from_run(mode, f"Brain step, {entries:,} entries", run)


# ---------------------------------------------------------------------------- age


@dataclass(frozen=True)
class Age:
    submissions: int = 1_000
    entries_each: int = 10  # entries per submission: 10,000 in all
    young: int = 10  # submissions settled when the young session is measured
    steps: int = 200  # Brain steps counted at each age
    stream_lengths: tuple[int, ...] = (2_000, 8_000, 32_000)
    chunk: int = 40  # characters per save: about 100 ms of a model's tokens


QUICK_AGE = Age(submissions=200, steps=100, stream_lengths=(2_000, 8_000))
TARGET_FLAT = 1.10


@dataclass
class Counted:
    """Server counters: commands, client bytes in and out, replication bytes, CPU s."""

    commands: float = 0.0
    bytes_in: float = 0.0
    bytes_out: float = 0.0
    replicated: float = 0.0
    cpu_s: float = 0.0

    def __sub__(self, o: Counted) -> Counted:
        return Counted(*(a - b for a, b in zip(astuple(self), astuple(o), strict=True)))

    def per(self, n: int) -> Counted:
        return Counted(*(v / n for v in astuple(self)))


async def counted(redis: Any) -> Counted:
    """The server's counters, in one INFO call (whose own command is not counted; its bytes
    are, see :func:`measured`)."""
    info = await redis.execute_command("INFO", "stats", "commandstats", "replication", "cpu")
    calls = sum(int(v["calls"]) for k, v in info.items()
                if k.startswith("cmdstat_") and k != "cmdstat_info")
    return Counted(calls, int(info["total_net_input_bytes"]),
                   int(info["total_net_output_bytes"]), int(info["master_repl_offset"]),
                   float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))


async def measured(redis: Any, n: int, call: Any) -> tuple[Counted, list[int]]:
    """The server's counters per call over ``n`` awaits of ``call(i)`` and each call's
    latency (ns), less what reading the counters costs (measured around no call)."""
    first, second = await counted(redis), await counted(redis)
    idle = second - first
    lat = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        await call(i)
        lat.append(time.perf_counter_ns() - t0)
    third = await counted(redis)
    return (third - second - idle).per(n), lat


def _submission_task(session: str, k: int) -> Task:
    return Task(id=f"{session}-t{k}", kind="generation", owner=session,
                submission_id=f"{session}-s{k}", input={"text": "send the five notices"},
                created_ms=k)


async def _settle_one(store: Store, session: str, k: int, entries_each: int) -> None:
    """One submission's life, as a Brain's passes write it: submitted, taken up, its
    entries committed, settled."""
    await _submit_open(store, session, k, entries_each)
    task = _submission_task(session, k)
    lease, state = await store.acquire_and_load(session, BRAIN, LEASE_MS)
    sub = state.submissions[task.submission_id or ""]
    live = state.tasks[task.id]
    now = now_ms()
    await store.commit(session, lease.fence, Writes(
        kind="final", tasks=[live.model_copy(update={"state": Terminal(outcome="completed")})],
        submissions=[sub.model_copy(update={"status": "completed", "answer": "sent all five",
                                            "settled_ms": now})],
        entries=[Entry(kind="model", text="All five notices are sent.", task_id=task.id,
                       submission_id=task.submission_id, ts_ms=now)],
        deadline_ms=-1), BRAIN)
    await store.release(session, lease.fence, LEASE_MS)


async def _open_one(store: Store, session: str, k: int, entries_each: int) -> None:
    """Take up submission ``k`` (waiting in the inbox) and commit its entries but the last."""
    from baton.brain.requests import request_writes

    lease, state = await store.acquire_and_load(session, BRAIN, LEASE_MS)
    writes, _, _ = request_writes(state)
    now = now_ms()
    task = _submission_task(session, k)
    writes.entries += [Entry(kind="model", text=f"Turn {k}.{j}: sent one notice, noted it.",
                             task_id=task.id, submission_id=task.submission_id, ts_ms=now)
                       for j in range(entries_each - 2)]  # + the user's, + the final one
    writes.deadline_ms = DEADLINE_MS
    await store.commit(session, lease.fence, writes, BRAIN)
    await store.release(session, lease.fence, LEASE_MS)


async def _steps(
    store: Store, session: str, k: int, n: int
) -> dict[str, tuple[Counted, list[int]]]:
    """``n`` Brain steps on the open submission ``k``: each a lease+load, a small commit and
    the release, counted apart."""
    redis, task = store.redis, _submission_task(session, k)
    fences: list[int] = []

    async def lease(_: int) -> None:
        got, _state = await store.acquire_and_load(session, BRAIN, LEASE_MS)
        fences.append(got.fence)

    async def commit(i: int) -> None:
        await store.commit(session, fences[-1], small_writes(task, i), BRAIN)

    async def release(_: int) -> None:
        await store.release(session, fences[-1], LEASE_MS)

    out: dict[str, tuple[Counted, list[int]]] = {}
    parts = {"lease+load": lease, "commit": commit, "release": release}
    each: dict[str, list[Counted]] = {name: [] for name in parts}
    lat: dict[str, list[int]] = {name: [] for name in parts}
    for i in range(n):  # one step at a time: counters around each part
        for name, call in parts.items():
            c, ns = await measured(redis, 1, lambda _, call=call, i=i: call(i))
            each[name].append(c)
            lat[name] += ns
    for name in parts:
        mean = Counted(*(sum(v) / n for v in zip(*map(astuple, each[name]), strict=True)))
        # The server's CPU is read in the same process as its timer ticks and INFO's own
        # work: the median of the calls' readings, not their mean
        mean.cpu_s = percentile([c.cpu_s for c in each[name]], 50)
        out[name] = (mean, lat[name])
    return out


async def replica_of(primary: RedisServer, replica: RedisServer) -> None:
    """Make ``replica`` follow ``primary`` and wait until it is in sync."""
    r = Redis.from_url(replica.url, decode_responses=True)
    p = Redis.from_url(primary.url, decode_responses=True)
    try:
        host, port = primary.url.rsplit("//", 1)[1].rsplit(":", 1)
        await r.replicaof(host, int(port.split("/")[0]))
        deadline = time.monotonic() + 30
        while (await r.info("replication")).get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise TimeoutError("the replica did not sync")
            await asyncio.sleep(0.05)
        while int((await p.info("replication")).get("connected_slaves", 0)) < 1:
            if time.monotonic() > deadline:
                raise TimeoutError("the primary does not see its replica")
            await asyncio.sleep(0.05)
    finally:
        await r.aclose()
        await p.aclose()


def _row(mode: str, operation: str, c: Counted, lat: list[int], ping_p50: float) -> dict[str, Any]:
    us = [x / 1000 for x in lat]
    p50 = percentile(us, 50)
    return {"mode": mode, "operation": operation, "n": len(us), "p50_us": p50,
            "p99_us": percentile(us, 99), "ratio_to_ping": p50 / ping_p50 if ping_p50 else None,
            "commands": c.commands, "bytes_in": c.bytes_in, "bytes_out": c.bytes_out,
            "replicated_bytes": c.replicated, "server_cpu_us": c.cpu_s * 1e6}


async def age(store: Store, cfg: Age, tag: str, console: Console) -> dict[str, Any]:
    """Per-step cost of a young and an old session (see the module text)."""
    session = f"age-{tag}"
    redis = store.redis
    ping, ping_lat = await measured(redis, 500, lambda _: redis.ping())
    ping_p50 = percentile([x / 1000 for x in ping_lat], 50)
    rows = [_row("raw", "PING (one Redis hop)", ping, ping_lat, ping_p50)]
    started = time.perf_counter()
    k = 0
    for k in range(cfg.young):
        await _settle_one(store, session, k, cfg.entries_each)
    young_at = (k + 1, await redis.llen(store.keys.session(session).entries))
    await _submit_open(store, session, cfg.young, cfg.entries_each)
    young = await _steps(store, session, cfg.young, cfg.steps)
    await _settle_open(store, session, cfg.young)
    for k in range(cfg.young + 1, cfg.submissions):
        await _settle_one(store, session, k, cfg.entries_each)
    old_at = (cfg.submissions, await redis.llen(store.keys.session(session).entries))
    await _submit_open(store, session, cfg.submissions, cfg.entries_each)
    old = await _steps(store, session, cfg.submissions, cfg.steps)
    fill_s = time.perf_counter() - started
    sk = store.keys.session(session)
    sizes = {"subs": await redis.hlen(sk.subs), "entries": await redis.llen(sk.entries),
             "receipts": await redis.xlen(sk.receipts)}
    flat: dict[str, dict[str, float]] = {}
    for part in ("lease+load", "commit"):
        (yc, ylat), (oc, olat) = young[part], old[part]
        rows.append(_row(f"young ({young_at[0]:,} settled, {young_at[1]:,} entries)", part,
                         yc, ylat, ping_p50))
        rows.append(_row(f"old ({old_at[0]:,} settled, {old_at[1]:,} entries)", part, oc,
                         olat, ping_p50))
        flat[part] = {name: (getattr(oc, name) / getattr(yc, name)
                             if getattr(yc, name) else 1.0)
                      for name in ("commands", "bytes_in", "bytes_out", "replicated", "cpu_s")}
    _print_age(rows, flat, sizes, console)
    return {"rows": rows, "old_to_young": flat, "sizes": sizes, "fill_s": round(fill_s, 2),
            "target": TARGET_FLAT,
            "met": all(v <= TARGET_FLAT for part in flat.values()
                       for name, v in part.items() if name != "cpu_s")}


async def _submit_open(store: Store, session: str, k: int, entries_each: int) -> None:
    task = _submission_task(session, k)
    await store.inbox.submit(session, agent="notices", compat=1,
                             wake_subject="bench.wake.notices.1", request_id=f"r{k}",
                             text=f"request {k}: send the five notices", task=task,
                             worker=worker_ref("client", "bench"),
                             submission_id=task.submission_id or "")
    await _open_one(store, session, k, entries_each)


async def _settle_open(store: Store, session: str, k: int) -> None:
    task = _submission_task(session, k)
    lease, state = await store.acquire_and_load(session, BRAIN, LEASE_MS)
    sub = state.submissions[task.submission_id or ""]
    await store.commit(session, lease.fence, Writes(
        kind="final", tasks=[state.tasks[task.id].model_copy(
            update={"state": Terminal(outcome="completed")})],
        submissions=[sub.model_copy(update={"status": "completed", "settled_ms": now_ms()})],
        deadline_ms=-1), BRAIN)
    await store.release(session, lease.fence, LEASE_MS)


def _print_age(rows: list[dict[str, Any]], flat: dict[str, dict[str, float]],
               sizes: dict[str, int], console: Console) -> None:
    table = Table(title="Per-step cost by a session's age, per call, counted on the server "
                  "(ratio = p50 / PING p50)", title_justify="left")
    for name in ("session", "step", "p50 µs", "ratio", "commands", "bytes in", "bytes out",
                 "replicated bytes", "server CPU µs"):
        table.add_column(name, justify="left" if name in ("session", "step") else "right")
    for r in rows:
        table.add_row(r["mode"], r["operation"], f"{r['p50_us']:.0f}",
                      f"{r['ratio_to_ping']:.2f}x", f"{r['commands']:.1f}",
                      f"{r['bytes_in']:,.0f}", f"{r['bytes_out']:,.0f}",
                      f"{r['replicated_bytes']:,.0f}", f"{r['server_cpu_us']:.0f}")
    console.print(table)
    console.print(f"the old session holds {sizes['subs']:,} submissions, {sizes['entries']:,} "
                  f"entries and {sizes['receipts']:,} receipts")
    for part, f in flat.items():
        worst = max(v for name, v in f.items() if name != "cpu_s")
        console.print(
            f"{part}: old / young: commands {f['commands']:.2f}x, bytes in "
            f"{f['bytes_in']:.2f}x, out {f['bytes_out']:.2f}x, replicated "
            f"{f['replicated']:.2f}x, server CPU {f['cpu_s']:.2f}x -> target <= "
            f"{TARGET_FLAT}x for the counts: "
            + ("met" if worst <= TARGET_FLAT else "[red]missed[/red]"))


async def stream(store: Store, cfg: Age, tag: str, console: Console) -> dict[str, Any]:
    """Bytes a streamed text costs, by its length (see the module text)."""
    redis = store.redis
    rows = []
    chunked = "offset" in inspect.signature(store.save_partial).parameters
    for length in cfg.stream_lengths:
        session = f"stream-{tag}-{length}"
        task = generation_task(session)
        await store.inbox.submit(session, agent="notices", compat=1,
                                 wake_subject="bench.wake.notices.1", request_id="r",
                                 text="stream", task=task, worker=worker_ref("client", "bench"),
                                 submission_id=task.submission_id or "")
        lease = await store.acquire(session, BRAIN, LEASE_MS)
        text = ("The notices went out to every customer on the list, one by one. " * (
            length // 60 + 1))[:length]
        saves = range(cfg.chunk, length + 1, cfg.chunk)

        async def save(i: int, lease: Any = lease, text: str = text, session: str = session,
                       saves: range = saves, task: Task = task) -> None:
            end = saves[i]
            start = end - cfg.chunk
            kw: dict[str, Any] = (
                {"offset": start, "delta": text[start:end], "chars": end} if chunked
                else {"text": text[:end], "delta": text[start:end]})
            await store.save_partial(session, lease.fence, BRAIN, task_id=task.id,
                                     request_id="q:1:0", **kw)

        c, _lat = await measured(redis, len(saves), save)
        saved = await store.partial(session)
        assert saved is not None and saved.text == text[:saves[-1]], "the saved text"
        total = c.per(1)
        rows.append({"chars": length, "saves": len(saves),
                     "bytes_in": total.bytes_in * len(saves),
                     "replicated_bytes": total.replicated * len(saves),
                     "bytes_in_per_char": total.bytes_in * len(saves) / length,
                     "replicated_per_char": total.replicated * len(saves) / length})
    table = Table(title=f"Streamed text: bytes by its length (one save per {cfg.chunk} "
                  "characters)", title_justify="left")
    for name in ("characters", "saves", "bytes sent", "bytes replicated", "sent / char",
                 "replicated / char"):
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(f"{r['chars']:,}", f"{r['saves']:,}", f"{r['bytes_in']:,.0f}",
                      f"{r['replicated_bytes']:,.0f}", f"{r['bytes_in_per_char']:.1f}",
                      f"{r['replicated_per_char']:.1f}")
    console.print(table)
    growth = rows[-1]["replicated_per_char"] / rows[0]["replicated_per_char"]
    console.print(f"replicated bytes per character, longest / shortest text: {growth:.2f}x "
                  "(1x: linear in the text's length)")
    return {"rows": rows, "replicated_per_char_growth": growth, "chunk": cfg.chunk}


async def run(quick: bool = False, console: Console | None = None) -> Result:
    console = console or Console()
    cfg = QUICK if quick else Config()
    env = environment()
    started = time.perf_counter()
    age_cfg = QUICK_AGE if quick else Age()
    async with RedisServer() as server, RedisServer() as replica:
        await replica_of(server, replica)
        settings = Settings(redis_url=server.url, namespace="bench")
        held = await Store.connect(
            settings, entry_cache=EntryCache(settings.entry_cache_bytes))
        read = await Store.connect(settings)
        try:
            tag = f"{int(time.time())}"
            rows = [await measure(store, n, cfg, tag, mode)
                    for mode, store in (("held", held), ("read", read)) for n in SIZES]
            aged = await age(held, age_cfg, tag, console)
            streamed = await stream(held, age_cfg, tag, console)
        finally:
            await held.close()
            await read.close()
    for mode in ("held", "read"):
        mine = [r for r in rows if r.mode == mode]
        for r in mine:
            r.ratio = r.p50_us / mine[0].p50_us
    print_rows(f"Per-step cost by history length (µs; ratio = p50 / p50 at {SIZES[0]} entries; "
               f"the store loads the newest {settings.entries_page} entries)", rows, console)
    last = rows[len(SIZES) - 1].ratio or 0.0  # entries held
    cold = rows[-1].ratio or 0.0
    console.print(f"target: step at {SIZES[-1]:,} entries <= {TARGET_RATIO}x that at "
                  f"{SIZES[0]}, entries held: measured {last:.2f}x -> "
                  + ("met" if last <= TARGET_RATIO else "[red]missed[/red]")
                  + f" (every entry of the page read: {cold:.2f}x)")
    return Result(NAME, rows, env=env, extra={
        "config": asdict(cfg), "sizes": SIZES, "entries_page": settings.entries_page,
        "ratio_last_to_first": last, "ratio_last_to_first_read": cold,
        "target_ratio": TARGET_RATIO, "age": {"config": asdict(age_cfg), **aged},
        "stream": streamed,
        "elapsed_s": round(time.perf_counter() - started, 2)})
