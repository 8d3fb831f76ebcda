"""The faults of a chaos run (:mod:`baton.devkit.chaos.run`), from its seeded generator.

:class:`ChaosFaults` kills, pauses, restarts and partitions until every submission settled,
then resumes the paused workers:

- every ``kill_every`` seconds a random brain, hands or relay is SIGKILLed; the supervisor
  starts it again after its backoff, as an orchestrator would;
- every ``pause_every`` seconds a random brain or hands is SIGSTOPped for :data:`PAUSE_S`,
  longer than its lease, attempt TTL and ack wait, then SIGCONTed: it comes back stale;
- Redis and NATS are each SIGKILLed and started again on the same port and data (for
  :data:`SERVER_DOWN_S`), the network is cut for :data:`PARTITION_S`, and (``reshard``, a
  cluster) the slot of a random shard moves to another primary :data:`RESHARD_BATCH` keys
  at a time (:mod:`baton.devkit.reshard`), the given number of times, spread evenly over the
  submission window.

It counts what it did in the run's :class:`~baton.devkit.chaos.checks.ChaosReport` and keeps
what the checks need to tell its doing from the system's: the kills by process, the workers
it paused (or cut off from Redis), and when each server was last restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Callable

from baton.devkit.chaos.checks import ChaosConfig, ChaosReport
from baton.devkit.devstack import DevStack, Proc
from baton.devkit.redis_cluster import ClusterStack
from baton.devkit.reshard import move_slot, shard_slots
from baton.store.store import now_ms

__all__ = ["PARTITION_KINDS", "PARTITION_S", "PAUSE_S", "SERVER_DOWN_S", "ChaosFaults"]

PAUSE_S = 3.0  # past the lease (2 s), the attempt TTL (1.5 s) and the ack wait (2 s)
SERVER_DOWN_S = 0.5  # how long Redis / NATS stay down on each restart
PARTITION_S = 3.0  # how long each partition lasts: past a cluster failover (node timeout 1 s)
PARTITION_KINDS = ("redis_node", "nats_node", "worker_from_redis", "worker_from_nats")
RESHARD_BATCH = 2  # keys per MIGRATE: a session stays split over two nodes for longer


class ChaosFaults:
    """The fault loop of one run (:meth:`run`).

    ``done`` is set once every submission settled (the loop then ends after the restarts
    still scheduled); ``submitted`` tells how many were submitted so far (recorded with each
    restart); ``on_progress`` is called after each fault and each look.
    """

    def __init__(self, cfg: ChaosConfig, stack: DevStack, rng: random.Random,
                 report: ChaosReport, done: asyncio.Event, submitted: Callable[[], int],
                 on_progress: Callable[[], None]) -> None:
        self.cfg = cfg
        self.stack = stack
        self.rng = rng
        self.report = report
        self.done = done
        self.submitted = submitted
        self.on_progress = on_progress
        self.kills_by_name: Counter[str] = Counter()
        self.paused: set[str] = set()  # paused, or cut off from Redis: may act late
        # server -> (monotonic, wall ms, sessions submitted) at its last restart
        self.restarted_at: dict[str, tuple[float, int, int]] = {}
        self._resumes: set[asyncio.Task[None]] = set()

    def _victims(self, roles: tuple[str, ...]) -> list[Proc]:
        return [p for p in self.stack.procs() if p.role in roles and p.alive and not p.paused]

    def kill_one(self) -> None:
        victims = self._victims(("brain", "hands", "relay"))
        if victims:
            p = self.rng.choice(victims)
            self.stack.kill(p.name)  # the supervisor starts it again
            self.kills_by_name[p.name] += 1
            self.report.kills[p.role] += 1

    def pause_one(self) -> None:
        victims = self._victims(("brain", "hands"))
        if victims:
            p = self.rng.choice(victims)
            self.stack.pause(p.name)
            self.paused.add(p.name)
            self.report.pauses += 1
            task = asyncio.create_task(self._resume_later(p.name))
            self._resumes.add(task)
            task.add_done_callback(self._resumes.discard)

    async def _resume_later(self, name: str) -> None:
        await asyncio.sleep(PAUSE_S)
        self.stack.resume(name)

    async def restart(self, server: str) -> None:
        if server == "partition":
            await self.partition()
            return
        if server == "reshard":
            await self.reshard()
            return
        if self.stack.clusters is not None:
            await self._restart_cluster_node(self.stack.clusters, server)
        else:
            servers = self.stack.servers
            assert servers is not None
            target = servers.redis if server == "redis" else servers.nats
            target.kill()  # SIGKILL: what the durable settings are for
            await asyncio.sleep(SERVER_DOWN_S)
            await target.restart()
        self.report.restarts[server] += 1
        self.restarted_at[server] = (time.monotonic(), now_ms(), self.submitted())

    async def _restart_cluster_node(self, clusters: ClusterStack, server: str) -> None:
        """SIGKILL one random node of the cluster and start it again on its data."""
        if server == "redis":
            node = self.rng.choice([n for n in clusters.redis.nodes if n.running])
            clusters.redis.kill(node)
            await asyncio.sleep(SERVER_DOWN_S)
            await clusters.redis.restart(node)
        else:
            nats = self.rng.choice([n for n in clusters.nats.nodes if n.running])
            nats.kill()
            await asyncio.sleep(SERVER_DOWN_S)
            await nats.restart()

    async def partition(self) -> None:
        """Cut the network for PARTITION_S (see :mod:`baton.devkit.chaos.run`), then heal
        it."""
        net = self.stack.net
        assert net is not None
        kind = self.rng.choice(PARTITION_KINDS)
        if kind == "redis_node":
            net.isolate(self.rng.choice(ClusterStack.REDIS_MEMBERS))
        elif kind == "nats_node":
            net.isolate(self.rng.choice(ClusterStack.NATS_MEMBERS))
        else:
            workers = [p for p in self.stack.procs() if p.member]
            if not workers:
                return
            p = self.rng.choice(workers)
            servers = (ClusterStack.REDIS_MEMBERS if kind == "worker_from_redis"
                       else ClusterStack.NATS_MEMBERS)
            net.split([p.member], servers)
            if kind == "worker_from_redis":
                self.paused.add(p.name)  # it may act late, as a paused worker does
        self.report.partitions[kind] += 1
        await asyncio.sleep(PARTITION_S)
        net.heal()

    async def reshard(self) -> None:
        """Move a random shard's slot to another primary while the sessions run."""
        clusters = self.stack.clusters
        assert clusters is not None
        shards = shard_slots(self.stack.namespace, self.stack.settings().shards)
        await move_slot(clusters.redis, self.rng.choice(sorted(shards.values())),
                        batch=RESHARD_BATCH)
        self.report.restarts["reshard"] += 1

    def _schedule(self) -> list[tuple[float, str]]:
        window = max(self.cfg.sessions / self.cfg.rate if self.cfg.rate > 0 else 5.0, 2.0)
        out: list[tuple[float, str]] = []
        for server, k, shift in (("redis", self.cfg.restart_redis, 0.0),
                                 ("nats", self.cfg.restart_nats, 0.5),
                                 ("partition", self.cfg.partitions, 0.25),
                                 ("reshard", self.cfg.reshard, 0.75)):
            slot = window / (k + 1)  # evenly spread; NATS half a slot after Redis
            out += [(slot * (j + 1 + shift), server) for j in range(k)]
        return sorted(out)

    async def run(self) -> None:
        """Kill, pause and restart until every submission settled; then resume the paused."""
        cfg = self.cfg
        start = time.monotonic()
        next_kill = start + cfg.kill_every if cfg.kill_every > 0 else float("inf")
        next_pause = start + cfg.pause_every if cfg.pause_every > 0 else float("inf")
        restarts = [(start + at, server) for at, server in self._schedule()]
        while not self.done.is_set() or restarts:
            now = time.monotonic()
            if restarts and now >= restarts[0][0]:
                await self.restart(restarts.pop(0)[1])
                self.on_progress()
                continue
            if now >= next_kill:
                self.kill_one()
                next_kill = now + cfg.kill_every * self.rng.uniform(0.5, 1.5)
            if now >= next_pause:
                self.pause_one()
                next_pause = now + cfg.pause_every * self.rng.uniform(0.5, 1.5)
            self.on_progress()
            wake = min(next_kill, next_pause, restarts[0][0] if restarts else float("inf"))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), max(0.01, min(wake - now, 1.0)))
        for task in list(self._resumes):
            task.cancel()
        for p in self.stack.procs():
            if p.paused:
                self.stack.resume(p.name)
