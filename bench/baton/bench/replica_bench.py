"""The per-commit cost of the replica acknowledgement on a Redis Cluster (3+3, loopback).

One run, one cluster: the same Brain commit measured with ``redis_min_replicas`` 0 (the
primary's answer is the acknowledgement) and 1 (the script and ``WAIT 1`` on one
connection, see baton.store.replication), side by side.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from rich.console import Console

from baton.bench.common import Result, Row, environment, print_rows, sequential
from baton.bench.store_bench import BRAIN, LEASE_MS, generation_task, small_writes
from baton.devkit.redis_cluster import RedisClusterServers
from baton.settings import Settings
from baton.store.store import Store, worker_ref

NAME = "replica"
DESCRIPTION = "Brain commit on a Redis Cluster: min replicas 0 vs 1 (WAIT), p50/p99"


@dataclass(frozen=True)
class Config:
    sessions: int = 32
    commits: int = 2_000


QUICK = Config(sessions=16, commits=300)


async def measure(url: str, replicas: int, cfg: Config) -> Row:
    settings = Settings(redis_url=url, namespace=f"rb{replicas}", redis_min_replicas=replicas)
    store = await Store.connect(settings)
    try:
        sessions = [f"rep-{replicas}-{k}" for k in range(cfg.sessions)]
        fences, tasks = {}, {}
        for s in sessions:
            tasks[s] = generation_task(s)
            await store.inbox.submit(s, agent="notices", compat=1, wake_subject="bench.wake.n.1",
                                     request_id=f"req-{s}", text="send the five notices",
                                     task=tasks[s], worker=worker_ref("client", "bench"),
                                     submission_id=f"sub-{s}")
            fences[s] = (await store.acquire(s, BRAIN, LEASE_MS * 100)).fence

        async def commit(i: int) -> None:
            s = sessions[i % len(sessions)]
            await store.commit(s, fences[s], small_writes(tasks[s], i), BRAIN)

        run = await sequential(commit, cfg.commits, warmup=cfg.sessions)
    finally:
        await store.close()
    label = "primary only" if replicas == 0 else f"after WAIT {replicas}"
    return Row.from_run("cluster", f"Brain commit, {label}", run,
                        note=f"redis_min_replicas={replicas}")


async def run(quick: bool = False, console: Console | None = None) -> Result:
    console = console or Console()
    cfg = QUICK if quick else Config()
    env = environment()
    started = time.perf_counter()
    async with RedisClusterServers() as cluster:
        rows = [await measure(cluster.url, n, cfg) for n in (0, 1)]
    rows[1].ratio = rows[1].p50_us / rows[0].p50_us
    print_rows("Per-commit cost of the replica acknowledgement (µs; ratio = p50 / p50 "
               "without it)", rows, console)
    extra_p50 = rows[1].p50_us - rows[0].p50_us
    console.print(f"replica acknowledgement adds {extra_p50:.0f} µs at p50, "
                  f"{rows[1].p99_us - rows[0].p99_us:.0f} µs at p99 per commit")
    return Result(NAME, rows, env=env, extra={
        "config": asdict(cfg), "added_p50_us": extra_p50,
        "elapsed_s": round(time.perf_counter() - started, 2)})
