"""Document benchmark: ``Store.load`` cost as a document accumulates changes.

One session per size holds a "progress" document (a notice plan of 200 recipients with a
status per recipient); each change marks one more recipient as sent and is committed like a
phase would, through ``Store.commit`` under the lease. After ~10, 100, 1,000 and 3,000 changes
bench times ``Store.load`` of the session and counts the document's stored fields. Stored as
merge-patch deltas with a full baseline every K versions (``document_baseline_every``), a
load reads one baseline plus at most K-1 deltas, so its cost stays flat however many changes
were made; the commit of a change stays flat too (a small delta, a baseline every K-th).

Figures, not assertions: a table on stdout and ``bench/results/docs.json``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from baton.bench.common import Result, Row, environment, percentile
from baton.devkit.servers import RedisServer
from baton.models import Document, Task
from baton.settings import Settings
from baton.store.documents import next_change
from baton.store.store import Store, worker_ref
from baton.store.writes import Writes

NAME = "docs"
DESCRIPTION = "Store.load of a session whose document has 10 .. 3,000 changes (deltas + baselines)"

BRAIN = worker_ref("brain", "bench")
SESSION = "bench-docs"
RECIPIENTS = 200


@dataclass(frozen=True)
class Config:
    # 9 deltas after the newest baseline at each size (K - 1 = 15 is the most a load reads).
    checkpoints: tuple[int, ...] = (10, 106, 1_002, 3_002)
    loads: int = 300
    warmup: int = 30
    every: int = 16  # document_baseline_every


QUICK = Config(checkpoints=(10, 106, 1_002), loads=50, warmup=5)


def value_at(n: int) -> dict[str, Any]:
    """The document after ``n`` changes: change k sent one more notice to recipient k % 200."""

    def sends(i: int) -> int:  # how many k in 1..n have k % RECIPIENTS == i
        first = i or RECIPIENTS
        return 0 if n < first else (n - first) // RECIPIENTS + 1

    return {
        "subject": "Notice",
        "recipients": [f"r{i}@example.com" for i in range(RECIPIENTS)],
        "sends": {f"r{i}": sends(i) for i in range(RECIPIENTS)},
        "changes": n,
    }


async def build(store: Store, session: str, changes: int, every: int) -> list[int]:
    """A session whose "progress" document went through ``changes`` commits; commit ns."""
    await store.inbox.start_task(
        session, agent="bench", compat=1, wake_subject="bench.wake.bench.1",
        request_id="r", task=Task(id="t", kind="bench", owner=session),
        worker=worker_ref("client", "bench"))
    fence = (await store.acquire(session, BRAIN, 600_000)).fence
    doc: Document | None = None
    commit_ns = []
    for version in range(1, changes + 1):
        change = next_change(doc, "progress", value_at(version), version, every)
        t0 = time.perf_counter_ns()
        await store.commit(session, fence, Writes(kind="doc", documents=[change]), BRAIN)
        commit_ns.append(time.perf_counter_ns() - t0)
        doc = change.document
    loaded = (await store.load(session)).documents["progress"]
    assert loaded.version == changes and loaded.value == value_at(changes), "round trip"
    return commit_ns


async def run(quick: bool = False, console: Console | None = None) -> Result:
    console = console or Console()
    cfg = QUICK if quick else Config()
    started = time.perf_counter()
    facts: list[dict[str, Any]] = []
    async with RedisServer() as server:
        settings = Settings(redis_url=server.url, namespace="bench",
                            document_baseline_every=cfg.every)
        store = await Store.connect(settings)
        try:
            sessions = {n: f"bench-docs-{n}" for n in cfg.checkpoints}
            commits = {n: await build(store, sid, n, cfg.every) for n, sid in sessions.items()}
            # Interleaved, so that other work on the machine weighs on every size alike.
            samples: dict[int, list[int]] = {n: [] for n in sessions}
            for i in range(cfg.warmup + cfg.loads):
                for n, sid in sessions.items():
                    t0 = time.perf_counter_ns()
                    await store.load(sid)
                    if i >= cfg.warmup:
                        samples[n].append(time.perf_counter_ns() - t0)
            for n, sid in sessions.items():
                fields = await store.redis.hlen(store.keys.session(sid).docs)
                recent = sorted(commits[n][-200:])
                facts.append({"changes": n, "doc_fields": fields,
                              "commit_p50_us": round(recent[len(recent) // 2] / 1000, 1)})
        finally:
            await store.close()
    rows = []
    for f in facts:
        us = [ns / 1000 for ns in samples[f["changes"]]]
        rows.append(Row(mode="fast", operation=f"load after {f['changes']:,} changes",
                        writers=1, n=len(us), p50_us=percentile(us, 50),
                        p99_us=percentile(us, 99), ops_per_s=0.0,
                        note=f"{f['doc_fields']} doc fields"))
    for r in rows:
        r.ratio = r.p50_us / rows[0].p50_us
    table = Table(title=f"Store.load vs a document's changes (baseline every {cfg.every})",
                  title_justify="left")
    for col in ("changes", "doc fields", "load p50 µs", "load p99 µs", "vs fewest",
                "commit p50 µs (last 200)"):
        table.add_column(col, justify="right")
    for f, r in zip(facts, rows, strict=True):
        table.add_row(f"{f['changes']:,}", str(f["doc_fields"]), f"{r.p50_us:,.0f}",
                      f"{r.p99_us:,.0f}", f"{r.ratio:.2f}x", f"{f['commit_p50_us']:,.0f}")
    console.print(table)
    elapsed = time.perf_counter() - started
    console.print(f"[dim]{elapsed:.1f} s[/dim]")
    return Result(NAME, rows, env=environment(),
                  extra={"config": asdict(cfg), "checkpoints": facts,
                         "elapsed_s": round(elapsed, 2)})
