"""A private Redis Cluster on loopback, for tests and dev: 3 primaries with replicas.

:class:`RedisClusterServers` starts ``redis-server`` processes in cluster mode (each with its
own port, cluster-bus port and data dir), joins them with ``redis-cli --cluster create
--cluster-replicas N`` and returns once the cluster itself says it serves: every node reports
``cluster_state:ok`` with all 16384 slots assigned, and every primary has a replica whose
replication link is up. Single nodes can be SIGKILLed and restarted on their port, data and
``nodes.conf`` to test failover (a killed primary's replica is promoted after
``node_timeout_ms``) and lost state (a non-durable primary restarted empty before a failover
comes back as the primary of its slots, with no data).

Split-brain guard: every node runs with ``min-replicas-to-write`` (default 1) and
``min-replicas-max-lag`` (seconds), so a primary cut off from its replicas refuses writes
(``NOREPLICAS``) once their last acknowledgement is older than the lag, instead of
acknowledging writes its promoted replica on the majority side will never have. The price:
a primary left without a replica refuses writes too, until one is back or replaced.
``min_replicas_to_write=0`` turns the guard off.

Surviving a lost host: with one replica per primary (``replicas=1``, the tests' default) a
primary SIGKILLed for good leaves its promoted replica alone, and the guard then refuses
every write to its slots for good: a third of the store read-only until an operator acts.
What ``baton dev up --cluster`` runs (:class:`ClusterStack`) has two replicas per primary, so
the promoted one keeps the other as its replica and goes on taking writes at once (measured:
the first write after the promotion is taken; with one replica each, ``NOREPLICAS`` for as
long as the node stays down). Every node also allows replica migration
(``cluster-allow-replica-migration yes``, ``cluster-migration-barrier 1``): should a second
node of that shard die, a primary with two replicas lends one to the orphaned primary (Redis
waits about 5 s before it moves one, and the moved replica copies the data in full), so
the cluster heals towards one replica everywhere without an operator.

With ``tls`` (:class:`~baton.devkit.tls.TlsFiles`) every node takes TLS connections only,
and the nodes' own links are TLS too: the cluster bus (``--tls-cluster yes``) and
replication (``--tls-replication yes``); the seed URL becomes ``rediss+cluster://``. When
the nodes' config file turns the ``default`` user off (a secure stack), the nodes'
``credentials`` are what the queries here and ``redis-cli --cluster create`` log in with.

It lives beside :mod:`baton.devkit.servers` (whose :class:`RedisServer` each node is) rather
than inside it, to keep both modules readable.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from redis.asyncio import Redis
from redis.crc import key_slot
from redis.exceptions import RedisError

from baton.devkit.netns import Netns
from baton.devkit.process import Managed, find_binary, free_port
from baton.devkit.servers import NatsCluster, NatsServer, RedisServer
from baton.devkit.tls import TlsFiles
from baton.errors import ServerError

__all__ = ["ClusterNodeInfo", "ClusterStack", "RedisClusterNode", "RedisClusterServers"]

SLOTS = 16384
_POLL_S = 0.05


class RedisClusterNode(RedisServer):
    """One ``redis-server`` in cluster mode; its cluster-bus port is chosen free, not port+10000.

    ``nodes.conf`` stays in the data dir across :meth:`restart`, so a restarted node keeps its
    identity and rejoins the cluster (as a replica if its slots were failed over meanwhile).
    """

    name = "redis-cluster-node"

    def __init__(self, data_dir: Path, *, durable: bool, node_timeout_ms: int,
                 min_replicas_to_write: int = 0, min_replicas_max_lag_s: int = 10,
                 tls: TlsFiles | None = None) -> None:
        super().__init__(data_dir, durable=durable, tls=tls)
        self.node_timeout_ms = node_timeout_ms
        self.min_replicas_to_write = min_replicas_to_write
        self.min_replicas_max_lag_s = min_replicas_max_lag_s
        self.bus_port = 0

    def _argv(self) -> list[str]:
        if not self._fixed_port or not self.bus_port:  # a new port: a new bus port with it
            self.bus_port = free_port()
        return [
            *super()._argv(),
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--cluster-port", str(self.bus_port),
            "--min-replicas-to-write", str(self.min_replicas_to_write),
            "--min-replicas-max-lag", str(self.min_replicas_max_lag_s),
            # A primary left without replicas (its shard lost a second node) takes one from
            # a primary that has more than one: see the module docstring.
            "--cluster-allow-replica-migration", "yes",
            "--cluster-migration-barrier", "1",
            *(["--tls-cluster", "yes", "--tls-replication", "yes"] if self.tls else []),
        ]  # fmt: skip

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ClusterNodeInfo:
    """One line of ``CLUSTER NODES``, as seen by some node."""

    node_id: str
    address: str  # host:port
    role: str  # "primary" | "replica"
    primary_id: str  # the primary a replica follows ("" for a primary)
    failed: bool
    connected: bool
    slots: tuple[tuple[int, int], ...]  # inclusive ranges served (primaries)

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def serves(self, slot: int) -> bool:
        return any(lo <= slot <= hi for lo, hi in self.slots)


def parse_cluster_nodes(text: str) -> list[ClusterNodeInfo]:
    """Parse ``CLUSTER NODES`` output (importing/migrating slot markers are ignored)."""
    out = []
    for line in text.strip().splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        flags = set(parts[2].split(","))
        slots = []
        for item in parts[8:]:
            if item.startswith("["):
                continue
            lo, _, hi = item.partition("-")
            slots.append((int(lo), int(hi or lo)))
        out.append(ClusterNodeInfo(
            node_id=parts[0],
            address=parts[1].split("@", 1)[0],
            role="primary" if "master" in flags else "replica",
            primary_id="" if parts[3] == "-" else parts[3],
            failed=bool(flags & {"fail", "fail?", "noaddr"}),
            connected=parts[7] == "connected",
            slots=tuple(slots),
        ))
    return out


class RedisClusterServers(Managed):
    """``primaries`` x (1 + ``replicas``) private cluster nodes on loopback.

    ``url`` (same as :attr:`seed_url`) is the ``redis+cluster://`` form ``BATON_REDIS_URL``
    takes. ``node_timeout_ms`` bounds how soon a dead primary's replica is promoted.
    ``min_replicas_to_write`` / ``min_replicas_max_lag_s``: the split-brain guard (see the
    module docstring); the guard is off when there are no replicas.
    """

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        primaries: int = 3,
        replicas: int = 1,
        durable: bool = False,
        node_timeout_ms: int = 1_000,
        min_replicas_to_write: int = 1,
        min_replicas_max_lag_s: int = 5,
        cli: str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        hint = "install Redis >= 7 with its CLI (Debian: apt-get install redis-tools)"
        self._cli = find_binary("redis-cli", cli, "BATON_REDIS_CLI", [], hint)
        self.primaries = primaries
        self.replicas = replicas
        self.durable = durable
        self.tls = tls
        self._owns_dir = base_dir is None
        tmp = base_dir or Path(tempfile.mkdtemp(prefix="baton-redis-cluster-"))
        self.base_dir = tmp.resolve()
        self.nodes = [
            RedisClusterNode(self.base_dir / f"r{i + 1}", durable=durable,
                             node_timeout_ms=node_timeout_ms,
                             min_replicas_to_write=min(min_replicas_to_write, replicas),
                             min_replicas_max_lag_s=min_replicas_max_lag_s, tls=tls)
            for i in range(primaries * (1 + replicas))
        ]

    # ------------------------------------------------------------------ addresses

    @property
    def seed_url(self) -> str:
        """Every node as a seed: a client finds the cluster while any one of them answers."""
        scheme = "rediss+cluster" if self.tls is not None else "redis+cluster"
        return f"{scheme}://" + ",".join(n.address for n in self.nodes)

    @property
    def url(self) -> str:
        return self.seed_url

    def node_at(self, port: int) -> RedisClusterNode:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(f"no cluster node on port {port}")

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the nodes, create the cluster once (a restart rejoins from nodes.conf)."""
        await asyncio.gather(*(n.start() for n in self.nodes))
        if not await self._formed():
            await self._create()
        else:
            await self._rejoin()
        await self.wait_ready()

    async def stop(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        await asyncio.gather(*(n.stop(timeout) for n in self.nodes))
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def kill(self, node: RedisClusterNode) -> None:
        """SIGKILL one node; its data dir and nodes.conf stay for :meth:`restart`."""
        node.kill()

    async def restart(self, node: RedisClusterNode, *, empty: bool = False) -> None:
        """Start ``node`` again on its port; ``empty`` drops its data (not its identity) first,
        as a non-durable node that lost its memory does."""
        await node._terminate(5.0)
        if empty:
            for name in ("appendonlydir", "dump.rdb"):
                path = node.data_dir / name
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(
                    missing_ok=True)
        await node.restart()


    # ------------------------------------------------------------------ topology queries

    async def topology(self) -> list[ClusterNodeInfo]:
        """``CLUSTER NODES`` as the first running node that answers sees it."""
        for node in self.nodes:
            if not node.running:
                continue
            try:
                async with _client(node) as r:
                    return parse_cluster_nodes(await r.execute_command("CLUSTER", "NODES"))
            except (RedisError, OSError):
                continue
        raise ServerError("no Redis Cluster node answers", server="redis-cluster")

    async def primary_for_slot(self, slot: int) -> RedisClusterNode:
        for info in await self.topology():
            if info.role == "primary" and not info.failed and info.serves(slot):
                return self.node_at(info.port)
        raise ServerError(f"no live primary serves slot {slot}", server="redis-cluster")

    async def primary_for_key(self, key: str) -> RedisClusterNode:
        """The primary serving ``key`` (hash tags respected)."""
        return await self.primary_for_slot(key_slot(key.encode()))

    async def replica_of(self, primary: RedisClusterNode) -> RedisClusterNode:
        topo = await self.topology()
        ids = {i.port: i.node_id for i in topo}
        for info in topo:
            if info.role == "replica" and info.primary_id == ids.get(primary.port):
                return self.node_at(info.port)
        raise ServerError(f"primary {primary.address} has no replica", server="redis-cluster")

    # ------------------------------------------------------------------ readiness

    async def wait_ready(self, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        """Until every running node says ``cluster_state:ok`` with all slots assigned, and
        each primary that serves slots has a replica whose replication link is up."""
        deadline = time.monotonic() + timeout
        problem = "not checked"
        while time.monotonic() < deadline:
            problem = await self._not_ready()
            if not problem:
                return
            await asyncio.sleep(_POLL_S)
        raise ServerError(f"Redis Cluster not ready within {timeout:g}s: {problem}",
                          server="redis-cluster")

    async def wait_promoted(self, old: RedisClusterNode, timeout: float = 30.0) -> RedisClusterNode:  # noqa: ASYNC109
        """After ``old`` (a primary) died: wait until another node serves its slots and the
        surviving nodes report ``cluster_state:ok``; returns the new primary."""
        deadline = time.monotonic() + timeout
        ranges: tuple[tuple[int, int], ...] = ()
        while time.monotonic() < deadline:
            try:
                topo = await self.topology()
            except ServerError:
                topo = []
            for info in topo:
                if info.port == old.port and info.slots:
                    ranges = info.slots
            if ranges:
                slot = ranges[0][0]
                for info in topo:
                    if (info.role == "primary" and info.port != old.port and not info.failed
                            and info.serves(slot) and await self._states_ok()):
                        return self.node_at(info.port)
            await asyncio.sleep(_POLL_S)
        raise ServerError(f"no replica of {old.address} promoted within {timeout:g}s",
                          server="redis-cluster")

    # ------------------------------------------------------------------ internals

    async def _formed(self) -> bool:
        async with _client(self.nodes[0]) as r:
            info = await r.execute_command("CLUSTER", "INFO")
        return _info_field(info, "cluster_known_nodes") == str(len(self.nodes))

    async def _rejoin(self) -> None:
        """Tell every node where every other node listens now.

        A durable cluster started again gets new ports, while each ``nodes.conf`` still names
        the old ones, so no node could reach another. ``CLUSTER MEET`` with the new address of a
        node already known by id makes the node update that address (Redis matches the id in
        the handshake reply), which is what lets the cluster form again with its data.
        """
        for node in self.nodes:
            async with _client(node) as r:
                for other in self.nodes:
                    if other is not node:
                        await r.execute_command("CLUSTER", "MEET", other.host, other.port,
                                                other.bus_port)

    async def _create(self) -> None:
        argv = [self._cli, "--cluster", "create", *(n.address for n in self.nodes),
                "--cluster-replicas", str(self.replicas), "--cluster-yes",
                *(["--tls", "--cacert", str(self.tls.ca)] if self.tls is not None else [])]
        env = None
        if self.nodes[0].credentials is not None:  # the password by environment, not argv
            user, password = self.nodes[0].credentials
            argv[1:1] = ["--user", user]
            env = {**os.environ, "REDISCLI_AUTH": password}
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=env)
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise ServerError(f"redis-cli --cluster create failed ({proc.returncode}):\n"
                              f"{out.decode(errors='replace')[-2000:]}", server="redis-cluster")

    async def _states_ok(self) -> bool:
        for node in self.nodes:
            if not node.running:
                continue
            try:
                async with _client(node) as r:
                    info = await r.execute_command("CLUSTER", "INFO")
            except (RedisError, OSError):
                return False
            if _info_field(info, "cluster_state") != "ok":
                return False
        return True

    async def _not_ready(self) -> str:
        """Why the cluster is not ready yet ("" once it is)."""
        running = [n for n in self.nodes if n.running]
        for node in running:
            try:
                async with _client(node) as r:
                    info = await r.execute_command("CLUSTER", "INFO")
                    repl = await r.info("replication")
            except (RedisError, OSError) as exc:
                return f"{node.address}: {exc}"
            state = _info_field(info, "cluster_state")
            assigned = _info_field(info, "cluster_slots_assigned")
            if state != "ok" or assigned != str(SLOTS):
                return f"{node.address}: cluster_state {state}, {assigned} slots assigned"
            if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                return f"{node.address}: replica link {repl.get('master_link_status')}"
            # A replica may call its link up while its primary still counts it as syncing
            # (state wait_bgsave): until the primary counts enough good replicas it refuses
            # writes with NOREPLICAS, so readiness is the primary's view too.
            good = repl.get("min_slaves_good_slaves")
            if (repl.get("role") == "master" and good is not None
                    and int(good) < node.min_replicas_to_write):
                states = [v.get("state") for k, v in repl.items()
                          if k.startswith("slave") and isinstance(v, dict)]
                return (f"{node.address}: {good} good replicas of "
                        f"{node.min_replicas_to_write} to write (replicas: {states})")
        topo = await self.topology()
        live = {n.port for n in running}
        for info in topo:
            if info.role != "primary" or not info.slots or info.failed:
                continue
            followers = [r for r in topo if r.primary_id == info.node_id and not r.failed
                         and r.port in live]
            if not followers:
                return f"primary {info.address} has no connected replica"
        return ""


def _client(node: RedisClusterNode) -> Redis:
    user, password = node.credentials or (None, None)
    tls: dict[str, object] = ({"ssl": True, "ssl_ca_certs": str(node.tls.ca)}
                              if node.tls is not None else {})
    return Redis(host=node.host, port=node.port, decode_responses=True,
                 socket_connect_timeout=0.5, socket_timeout=1.0, username=user,
                 password=password, **tls)  # type: ignore[arg-type]


def _info_field(info: object, name: str) -> str:
    """A field of ``CLUSTER INFO`` (redis-py returns text or a parsed dict by version)."""
    if isinstance(info, dict):
        return str(info.get(name, ""))
    for line in str(info).splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    return ""


class ClusterStack(Managed):
    """What ``baton dev up --cluster`` runs: a Redis Cluster of 3 primaries with 2 replicas
    each and a 3-node JetStream cluster, with the surface of
    :class:`~baton.devkit.servers.EmbeddedStack`.

    Two replicas per primary is what surviving one lost host takes (see the module
    docstring): the primary's replica promoted in its place still has a replica, so the
    split-brain guard (``min-replicas-to-write 1``) keeps taking its writes."""

    #: Replicas per primary: one lost node leaves every shard a primary and a replica.
    REDIS_REPLICAS = 2
    #: Member names of the servers in a :class:`~baton.devkit.netns.Netns`.
    REDIS_MEMBERS = tuple(f"redis-{i + 1}" for i in range(3 * (1 + REDIS_REPLICAS)))
    NATS_MEMBERS = ("nats-1", "nats-2", "nats-3")

    def __init__(self, base_dir: Path | None = None, *, durable: bool = False,
                 netns: Netns | None = None, tls: TlsFiles | None = None,
                 nats_config: str = "", nats_route_password: str | None = None) -> None:
        """``netns``: run every server in its own member of it (see :attr:`REDIS_MEMBERS`,
        :attr:`NATS_MEMBERS`) instead of on loopback. ``tls``: every server and link over
        TLS; ``nats_config``: appended to each NATS node's file (its users);
        ``nats_route_password``: the NATS nodes accept routes only with it."""
        self.redis = RedisClusterServers(base_dir / "redis" if base_dir else None,
                                         primaries=3, replicas=self.REDIS_REPLICAS,
                                         durable=durable, tls=tls)
        hosts = [netns.address(m) for m in self.NATS_MEMBERS] if netns else None
        self.nats = NatsCluster(base_dir / "nats" if base_dir else None, durable=durable,
                                hosts=hosts, tls=tls, extra_config=nats_config,
                                route_password=nats_route_password)
        if netns is not None:
            for node, member in zip(self.redis.nodes, self.REDIS_MEMBERS, strict=True):
                netns.place(node, member)
            for nats, member in zip(self.nats.nodes, self.NATS_MEMBERS, strict=True):
                netns.place(nats, member)

    @property
    def redis_url(self) -> str:
        return self.redis.url

    @property
    def nats_url(self) -> str:
        return self.nats.url

    @property
    def members(self) -> list[RedisServer | NatsServer]:
        """Every server process (for a stack's process list)."""
        return [*self.redis.nodes, *self.nats.nodes]

    async def start(self) -> None:
        await asyncio.gather(self.redis.start(), self.nats.start())

    async def stop(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        await asyncio.gather(self.redis.stop(timeout), self.nats.stop(timeout))
