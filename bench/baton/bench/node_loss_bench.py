"""A server node lost for good: how long sessions in flight, and submitted right after, stall.

Per trial one :class:`~baton.devkit.devstack.DevStack` on the clusters ``baton dev up --cluster``
runs (3 Redis primaries with 2 replicas each, 3 NATS nodes with R3 streams; 2 Brains, 3
Hands, 2 relays), warmed up with sequential five-notice sessions (their median is the
baseline). Then a few sessions are submitted, one node is SIGKILLed and never restarted,
and as many sessions are submitted right after; each is timed from its submit to settled,
and so are the sessions after those (back to the baseline?). Targets:

- ``nats``: the NATS node leading the wake stream (each of the three nodes leads some of
  the five Raft groups: the two streams, their consumers and the meta group, so losing any
  node loses leaders). Also timed: when the surviving nodes name a new leader for each
  stream and consumer the dead node led, asked of them every 50 ms; until then sessions
  run around them (:mod:`baton.bus.fallback`).
- ``redis``: the Redis primary serving the first in-flight session; also timed, when a
  replica serves its slots.

The stall of a session is its time to settle less the baseline. Every session must
complete and each recipient be mailed once per session (the mail service's counts).
Figures, not assertions: see ``baton bench nodeloss``.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.errors
import nats.js.errors
from rich.console import Console
from rich.table import Table

from baton.bench.common import Result, Row, environment, percentile
from baton.client import Client
from baton.devkit.devstack import DevStack
from baton.devkit.nats_servers import NatsServer
from baton.devkit.redis_cluster import RedisClusterNode, RedisClusterServers

NAME = "nodeloss"
DESCRIPTION = "a NATS node or Redis primary SIGKILLed for good: stall of sessions around it"

FIVE = ("Send the approved notice to ada@example.com, grace@example.com, linus@example.com, "
        "margaret@example.com and barbara@example.com, then summarise.")
RECIPIENTS = 5
_LEADER_POLL_S = 0.05


@dataclass(frozen=True)
class Config:
    trials: int = 3  # per target, each on a fresh stack
    warmup: int = 8
    around: int = 3  # sessions in flight at the kill, and as many submitted right after
    later: int = 5  # sequential sessions after those


QUICK = Config(trials=1, warmup=4, around=3, later=3)


async def _session(client: Client, since: float) -> tuple[float, float]:
    """(submitted at, seconds to settled) of one five-notice session, ``since`` the kill."""
    started = time.monotonic()
    sub, _ = await client.submit(FIVE, agent="notices")
    final = await client.wait(sub, timeout=120)
    if final.status != "completed":
        raise RuntimeError(f"session {sub.session_id} ended {final.status}: {final.error}")
    return started - since, time.monotonic() - started


async def _leaders(urls: list[str]) -> dict[str, str]:
    """Raft group -> the server leading it ("" for none), as the servers at ``urls`` see it."""
    nc = await nats.connect(urls, connect_timeout=1, max_reconnect_attempts=1,
                            reconnect_time_wait=0.1)
    try:
        js = nc.jetstream(timeout=1.0)
        out: dict[str, str] = {}
        for info in await js.streams_info():
            name = str(info.config.name)
            out[name] = (info.cluster.leader or "") if info.cluster else ""
            for consumer in await js.consumers_info(name):
                out[f"{name}/{consumer.name}"] = ((consumer.cluster.leader or "")
                                                  if consumer.cluster else "")
        return out
    finally:
        await nc.close()


async def _new_leaders(victim: NatsServer, survivors: list[NatsServer], led: list[str],
                       since: float) -> dict[str, float]:
    """Seconds after ``since`` at which each group ``victim`` led has another leader."""
    urls = [f"nats://{n.host}:{n.port}" for n in survivors]
    found: dict[str, float] = {}
    while len(found) < len(led) and time.monotonic() - since < 60:
        try:
            leaders = await _leaders(urls)
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError, OSError):
            leaders = {}
        for group in led:
            if group not in found and leaders.get(group) not in ("", None, victim.server_name):
                found[group] = time.monotonic() - since
        await asyncio.sleep(_LEADER_POLL_S)  # a poll of another process's state
    return found


async def _promoted(redis: RedisClusterServers, node: RedisClusterNode, since: float) -> float:
    """Seconds after ``since`` at which a replica of ``node`` serves its slots."""
    await redis.wait_promoted(node, 60)
    return time.monotonic() - since


async def _trial(target: str, cfg: Config, console: Console) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="baton-nodeloss-"))
    try:
        async with DevStack(base, cluster=True, brains=2, hands=3, relays=2,
                            namespace="bench", mail_persist=False) as stack:
            clusters = stack.clusters
            assert clusters is not None
            client = await Client.connect(stack.settings(worker_name="bench-client"))
            try:
                async with httpx.AsyncClient(base_url=stack.mail_url, timeout=5.0) as http:
                    now = time.monotonic()
                    warm = [(await _session(client, now))[1] for _ in range(cfg.warmup)]
                    baseline = percentile(warm, 50)
                    await http.post("/reset")
                    nats_nodes = list(clusters.nats.nodes)
                    urls = [f"nats://{n.host}:{n.port}" for n in nats_nodes]
                    before = await _leaders(urls)
                    kill_at = time.monotonic()
                    inflight = [asyncio.create_task(_session(client, kill_at))
                                for _ in range(cfg.around)]
                    await asyncio.sleep(0)  # let their submits start
                    led: list[str] = []
                    promoted: asyncio.Task[float] | None = None
                    leaders: asyncio.Task[dict[str, float]] | None = None
                    if target == "nats":
                        wake = next(g for g in before if g.endswith("_WAKE"))
                        victim = clusters.nats.node(before[wake])
                        led = sorted(g for g, s in before.items() if s == victim.server_name)
                        victim.kill()
                        killed = victim.server_name
                        kill_at = time.monotonic()
                        leaders = asyncio.create_task(_new_leaders(
                            victim, [n for n in nats_nodes if n is not victim], led, kill_at))
                    else:
                        sk = client.store.keys.session("bench-probe")
                        node = await clusters.redis.primary_for_key(sk.meta)
                        clusters.redis.kill(node)
                        killed = node.address
                        kill_at = time.monotonic()
                        promoted = asyncio.create_task(_promoted(clusters.redis, node, kill_at))
                    after = [asyncio.create_task(_session(client, kill_at))
                             for _ in range(cfg.around)]
                    around = [await t for t in [*inflight, *after]]
                    later = [await _session(client, kill_at) for _ in range(cfg.later)]
                    elected = await leaders if leaders is not None else {}
                    if promoted is not None:
                        elected = {"redis primary": await promoted}
                    stats = (await http.get("/stats")).json()
            finally:
                await client.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    sessions = cfg.around * 2 + cfg.later
    once = (stats["accepted"] == sessions * RECIPIENTS
            and all(n == sessions for n in stats["deliveries"].values()))
    stalls = [max(0.0, s - baseline) for _, s in around]
    result = {"target": target, "killed": killed, "baseline_s": baseline,
              "around_s": [s for _, s in around], "later_s": [s for _, s in later],
              "stall_max_s": max(stalls), "stall_median_s": percentile(stalls, 50),
              "later_max_s": max(s for _, s in later), "led": led, "new_leader_s": elected,
              "one_mail_each": once}
    console.print(f"[dim]{target}: killed {killed}; stall max {result['stall_max_s']:.2f}s; "
                  f"new leaders {', '.join(f'{g} {t:.2f}s' for g, t in elected.items())}"
                  f"[/dim]")
    return result


def print_node_loss(results: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="A node SIGKILLed for good (seconds; stall = time to settle less the "
                        "warm median)", title_justify="left")
    for col in ("target", "killed", "warm median", "stall median", "stall max",
                "later max", "new leaders after the kill", "one mail each"):
        table.add_column(col, justify="left" if col in ("target", "killed") else "right")
    for r in results:
        leaders = ", ".join(f"{g.rsplit('/', 1)[-1]} {t:.1f}" for g, t in
                            sorted(r["new_leader_s"].items(), key=lambda kv: kv[1]))
        table.add_row(r["target"], r["killed"], f"{r['baseline_s']:.3f}",
                      f"{r['stall_median_s']:.2f}", f"{r['stall_max_s']:.2f}",
                      f"{r['later_max_s']:.3f}", leaders or "-",
                      "yes" if r["one_mail_each"] else "[red]no[/red]")
    console.print(table)


async def run(quick: bool = False, console: Console | None = None) -> Result:
    console = console or Console()
    cfg = QUICK if quick else Config()
    results = [await _trial(target, cfg, console)
               for target in ("nats", "redis") for _ in range(cfg.trials)]
    print_node_loss(results, console)
    console.print(
        "[dim]The NATS figure: each JetStream stream and consumer is a Raft group; when its "
        "leader dies the others elect a new one only after their election timeout, 4 to 9 s, "
        "fixed in nats-server (the 'new leaders' column). Meanwhile work goes around them "
        "(baton.bus.fallback): the relay sends what a stream refuses as core NATS copies, "
        "workers read a consumer's subject from the stream's replicas, and the stored "
        "messages come again later as duplicates the fences turn away. The Redis figure: "
        "cluster-node-timeout (1 s here) and the replicas' election, then writes go on at "
        "once (two replicas per primary).[/dim]")
    rows = [Row(mode=r["target"], operation=f"{r['target']} node lost -> stall",
                writers=1, n=len(r["around_s"]), p50_us=r["stall_median_s"] * 1e6,
                p99_us=r["stall_max_s"] * 1e6, ops_per_s=float("nan"),
                note=f"killed {r['killed']}") for r in results]
    return Result(NAME, rows, env=environment(),
                  extra={"config": asdict(cfg), "trials": results})
