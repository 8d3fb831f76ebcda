"""Wait fan-out benchmark: what one waiting client hears while 1,000 other sessions settle.

A client waits (``Client.wait``) on one session's submission while 1,000 other sessions
commit the write that settles their submission, each with the settled notification the
Brain's final commit carries. Commits SPUBLISH on the session's own sharded channel and a
client SSUBSCRIBEs only to the sessions it waits on, so the waiting client should receive
one notification (its own), not 1,001. Then the waited session settles and the time from
that commit to ``wait`` returning is measured.

Run on one Redis server and on a 3+3 Redis Cluster. Figures, not assertions: a table on
stdout and ``bench/results/fanout.json``.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from baton.bench.common import Result, Row, environment
from baton.client import Client
from baton.devkit.redis_cluster import RedisClusterServers
from baton.devkit.servers import RedisServer
from baton.models import Submission
from baton.settings import Settings
from baton.store.notices import settled_notice
from baton.store.store import Store, now_ms, worker_ref
from baton.store.writes import Writes

NAME = "fanout"
DESCRIPTION = "notifications one waiting client receives while 1,000 other sessions settle"

WAKE = "fan.wake.notices.1"
BRAIN = worker_ref("brain", "bench-brain")
CLIENT = worker_ref("client", "bench")
LEASE_MS = 600_000


async def _open(store: Store, session: str) -> tuple[Submission, int]:
    """A submitted session under a Brain's lease: (its submission, the fence)."""
    from baton.bench.store_bench import generation_task

    task = generation_task(session)
    sub, _ = await store.inbox.submit(session, agent="notices", compat=1, wake_subject=WAKE,
                                      request_id=f"req-{session}", text="settle me", task=task,
                                      worker=CLIENT, submission_id=f"sub-{session}")
    lease = await store.acquire(session, BRAIN, LEASE_MS)
    return sub, lease.fence


async def _settle(store: Store, sub: Submission, fence: int) -> None:
    """The Brain's final commit: the submission settled, with its notification."""
    done = sub.model_copy(update={"status": "completed", "answer": "done",
                                  "settled_ms": now_ms()})
    writes = Writes(kind="final", submissions=[done],
                    notify=[(store.keys.settled_channel(sub.session_id),
                             settled_notice(done))])
    await store.commit(sub.session_id, fence, writes, BRAIN)


async def measure(topology: str, redis_url: str, others: int) -> dict[str, Any]:
    settings = Settings(redis_url=redis_url, namespace=f"fan{topology[0]}")
    client = await Client.connect(settings)
    store = client.store
    try:
        opened: list[tuple[Submission, int]] = []
        for i in range(0, others, 64):
            opened += await asyncio.gather(*(_open(store, f"other-{k}")
                                             for k in range(i, min(i + 64, others))))
        mine, my_fence = await _open(store, "waited")
        waiter = asyncio.create_task(client.wait(mine, timeout=120))
        # The first wait of a channel subscribes before it reads; give the SSUBSCRIBE time
        # to reach the server before the others settle (a figure, not a test).
        await client.settled.subscribed.wait()
        await asyncio.sleep(0.1)
        started = time.perf_counter()
        for i in range(0, others, 64):
            await asyncio.gather(*(_settle(store, sub, fence) for sub, fence in opened[i:i + 64]))
        settle_s = time.perf_counter() - started
        heard_from_others = client.notifications
        t0 = time.perf_counter()
        await _settle(store, mine, my_fence)
        final = await waiter
        wake_us = (time.perf_counter() - t0) * 1e6
        assert final.settled
        return {"topology": topology, "other_sessions_settled": others,
                "notifications_from_others": heard_from_others,
                "notifications_total": client.notifications,
                "own_settle_to_wait_return_us": round(wake_us, 1),
                "others_settled_per_s": round(others / settle_s, 1)}
    finally:
        await client.close()


async def run(quick: bool = False, console: Console | None = None) -> Result:
    console = console or Console()
    others = 200 if quick else 1_000
    figures = []
    with tempfile.TemporaryDirectory(prefix="baton-fanout-") as tmp:
        async with RedisServer(Path(tmp) / "single") as server:
            figures.append(await measure("single", server.url, others))
        async with RedisClusterServers(Path(tmp) / "cluster") as cluster:
            figures.append(await measure("cluster", cluster.seed_url, others))
    table = Table(title="Settled notifications received by one waiting client")
    for col in ("topology", "others settled", "heard from others", "total heard",
                "own settle -> wait returns (µs)"):
        table.add_column(col)
    for f in figures:
        table.add_row(f["topology"], str(f["other_sessions_settled"]),
                      str(f["notifications_from_others"]), str(f["notifications_total"]),
                      str(f["own_settle_to_wait_return_us"]))
    console.print(table)
    rows = [Row(mode=f["topology"], operation="own settle -> wait returns", writers=1, n=1,
                p50_us=f["own_settle_to_wait_return_us"],
                p99_us=f["own_settle_to_wait_return_us"], ops_per_s=0.0)
            for f in figures]
    return Result(NAME, rows, env=environment(), extra={"figures": figures})
