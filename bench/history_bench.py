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
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from rich.console import Console

from baton.bench.common import Result, Row, environment, print_rows, sequential
from baton.bench.store_bench import BRAIN, LEASE_MS, generation_task, small_writes
from baton.devkit.servers import RedisServer
from baton.models import Entry
from baton.settings import Settings
from baton.store.entry_cache import EntryCache
from baton.store.store import Store, now_ms, worker_ref
from baton.store.writes import Writes

NAME = "history"
DESCRIPTION = "Brain step (acquire+load, commit) with 10, 100 and 1,000 history entries"

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


async def run(quick: bool = False, console: Console | None = None) -> Result:
    console = console or Console()
    cfg = QUICK if quick else Config()
    env = environment()
    started = time.perf_counter()
    async with RedisServer() as server:
        settings = Settings(redis_url=server.url, namespace="bench")
        held = await Store.connect(
            settings, entry_cache=EntryCache(settings.entry_cache_bytes))
        read = await Store.connect(settings)
        try:
            tag = f"{int(time.time())}"
            rows = [await measure(store, n, cfg, tag, mode)
                    for mode, store in (("held", held), ("read", read)) for n in SIZES]
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
        "target_ratio": TARGET_RATIO,
        "elapsed_s": round(time.perf_counter() - started, 2)})
