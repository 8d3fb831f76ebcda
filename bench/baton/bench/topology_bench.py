"""One server each vs the clusters, in one run: five-notice sessions and what each costs.

Two :class:`~baton.devkit.devstack.DevStack` runs one after the other on the same machine,
one Brain, one Hands and one relay each (non-durable servers, the mail service without
delay): ``single`` (one ``redis-server``, one ``nats-server``) and ``cluster`` (a 3+3 Redis
Cluster with the replica acknowledgement, ``WAIT 1``, on every commit, and three NATS nodes
with streams of 3 replicas). For each:

* sessions/s and submit -> settled p50/p99 at concurrency 1 and 32;
* per session (over the concurrency-1 part): Redis commands (``INFO commandstats`` deltas,
  summed over the primaries), NATS messages and bytes in and out (``/varz`` deltas, summed
  over the nodes, cluster routes included);
* on the cluster, the per-commit cost of the replica acknowledgement (the ``replica``
  benchmark's Brain commit with ``redis_min_replicas`` 0 and 1, on the same cluster).

The machine is shared: compare the ratios (cluster / single) of one run, not the absolute
figures across runs. Figures, not assertions: ``bench/results/topology.json``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from redis.asyncio import Redis
from rich.console import Console
from rich.table import Table

from baton.bench import replica_bench
from baton.bench.common import Result, Row, environment, print_rows
from baton.bench.sessions import sessions
from baton.client import Client
from baton.devkit.devstack import DevStack
from baton.devkit.servers import NatsServer, RedisServer

NAME = "topology"
DESCRIPTION = "single Redis/NATS vs 3+3 Redis Cluster + 3 NATS: sessions/s, p50/p99, cost"


@dataclass(frozen=True)
class Config:
    c1: int = 60
    c32: int = 256
    warmup: int = 5
    replica: replica_bench.Config = field(
        default_factory=lambda: replica_bench.Config(sessions=16, commits=500))


QUICK = Config(c1=15, c32=64, warmup=2, replica=replica_bench.QUICK)


def _redis_nodes(stack: DevStack) -> list[RedisServer]:
    if stack.clusters is not None:
        return list(stack.clusters.redis.nodes)
    assert stack.servers is not None
    return [stack.servers.redis]


def _nats_nodes(stack: DevStack) -> list[NatsServer]:
    if stack.clusters is not None:
        return list(stack.clusters.nats.nodes)
    assert stack.servers is not None
    return [stack.servers.nats]


async def redis_commands(stack: DevStack) -> Counter[str]:
    """Commands served by the primaries (replicas only apply what primaries replicate)."""
    total: Counter[str] = Counter()
    for node in _redis_nodes(stack):
        if not node.running:
            continue
        async with Redis(host=node.host, port=node.port, decode_responses=True) as r:
            if (await r.info("replication")).get("role") != "master":
                continue
            stats = await r.info("commandstats")
        total.update({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})
    return total


async def nats_traffic(stack: DevStack) -> Counter[str]:
    total: Counter[str] = Counter()
    async with httpx.AsyncClient(timeout=5.0) as http:
        for node in _nats_nodes(stack):
            varz = (await http.get(f"http://{node.host}:{node.monitor_port}/varz")).json()
            total.update({k: int(varz[k]) for k in ("in_msgs", "out_msgs", "in_bytes",
                                                   "out_bytes")})
    return total


async def measure(topology: str, cfg: Config, console: Console) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix=f"baton-bench-{topology}-"))
    try:
        async with DevStack(base, brains=1, hands=1, relays=1, cluster=topology == "cluster",
                            mail_persist=False, namespace="bench") as stack:
            client = await Client.connect(stack.settings(worker_name="bench-client",
                                                         redis_max_connections=1024))
            try:
                redis0, nats0 = await redis_commands(stack), await nats_traffic(stack)
                c1 = await sessions(client, 1, cfg.c1, cfg.warmup)
                redis1, nats1 = await redis_commands(stack), await nats_traffic(stack)
                c32 = await sessions(client, 32, cfg.c32, cfg.warmup)
            finally:
                await client.close()
            n = cfg.c1 + cfg.warmup  # the warm-up sessions are inside the deltas
            redis = redis1 - redis0
            per_session = {
                "redis_commands": round(sum(redis.values()) / n, 1),
                # the script calls (FCALL: one round trip each, or a batch's share of one)
                # and the replica acknowledgements among them
                "redis_fcall": round(redis["fcall"] / n, 1),
                "redis_wait": round(redis["wait"] / n, 1),
                "redis_top": {k: round(v / n, 1) for k, v in redis.most_common(8)},
                **{f"nats_{k}": round((nats1[k] - nats0[k]) / n, 1) for k in nats0},
            }
            rows = [Row.from_run(topology, "five notices, c=1", c1, note="sessions"),
                    Row.from_run(topology, "five notices, c=32", c32, writers=32,
                                 note="sessions")]
            replica_rows: list[Row] = []
            if stack.clusters is not None:
                url = stack.clusters.redis.url
                replica_rows = [await replica_bench.measure(url, k, cfg.replica)
                                for k in (0, 1)]
            return {"rows": rows, "per_session": per_session, "replica": replica_rows}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def print_sizing(results: dict[str, dict[str, Any]], console: Console) -> None:
    table = Table(title="Per five-notice session (concurrency 1)")
    table.add_column("measure")
    for name in results:
        table.add_column(name, justify="right")
    keys = [k for k in next(iter(results.values()))["per_session"] if k != "redis_top"]
    for key in keys:
        table.add_row(key, *[f"{r['per_session'][key]:,.1f}" for r in results.values()])
    console.print(table)
    for name, r in results.items():
        console.print(f"[dim]{name}: top Redis commands per session "
                      f"{r['per_session']['redis_top']}[/dim]")


async def run(quick: bool = False, console: Console | None = None) -> Result:
    console = console or Console()
    cfg = QUICK if quick else Config()
    env = environment()
    started = time.perf_counter()
    results = {t: await measure(t, cfg, console) for t in ("single", "cluster")}
    rows: list[Row] = []
    for i in range(2):  # c=1, c=32: single then cluster, ratio = cluster / single p50
        single, cluster = results["single"]["rows"][i], results["cluster"]["rows"][i]
        single.ratio, cluster.ratio = 1.0, cluster.p50_us / single.p50_us
        rows += [single, cluster]
    print_rows("Five-notice sessions, one server each vs the clusters (µs; ratio = p50 / "
               "single p50; ops/s = sessions/s)", rows, console)
    replica = results["cluster"]["replica"]
    if replica:
        replica[1].ratio = replica[1].p50_us / replica[0].p50_us
        print_rows("Per-commit cost of the replica acknowledgement on the same cluster (µs)",
                   replica, console)
        rows += replica
    print_sizing(results, console)
    throughput = {f"c{c}": results["cluster"]["rows"][i].ops_per_s
                  / results["single"]["rows"][i].ops_per_s for i, c in enumerate((1, 32))}
    console.print("cluster / single sessions/s: " + ", ".join(
        f"{k} {v:.2f}x" for k, v in throughput.items()))
    return Result(NAME, rows, env=env, extra={
        "config": asdict(cfg), "per_session": {k: v["per_session"] for k, v in results.items()},
        "throughput_ratio": throughput,
        "replica_added_p50_us": (replica[1].p50_us - replica[0].p50_us) if replica else None,
        "elapsed_s": round(time.perf_counter() - started, 2)})
