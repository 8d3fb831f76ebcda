"""How a process connects to Redis: one client per role, failing fast, never retrying.

Owns :func:`connect_redis` (the pool, timeouts and TLS files from :class:`Settings`),
:func:`run_batch` (commands in one round trip, each reply in its place) and
:func:`redis_user`, the ACL user the URL names. Everything here is redis-py's public API:
its clients, its blocking pool and its pipelines.

``BATON_REDIS_URL`` names one server (``redis://`` / ``rediss://``, as redis-py reads it) or
the seed nodes of a Redis Cluster::

    redis+cluster://[user:password@]host1:port1[,host2:port2,...]
    rediss+cluster://...        the same over TLS (BATON_REDIS_TLS_* as for rediss://)

One reachable seed is enough to discover the cluster; list several so a start does not
depend on one node. A cluster has only database 0, so the URL takes no ``/db`` other than
``/0``. For such a URL :func:`connect_redis` returns a :class:`redis.asyncio.RedisCluster`.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, cast
from urllib.parse import unquote, urlsplit

from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError

from baton.errors import ConfigError
from baton.settings import Settings

#: Either client. Both offer the commands Baton uses (scripts, hashes, streams, pub/sub);
#: cluster-only code checks :func:`is_cluster` first.
AnyRedis: TypeAlias = Redis | RedisCluster

#: What a Redis call may raise when the server (or cluster) fails: redis-py's
#: RedisClusterException (no node for a slot, topology unreadable) is not a RedisError.
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisError, RedisClusterException, OSError)

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SLOTS = 16384
_REPLICA_GOSSIP_S = 3.0
_SETTING = "BATON_REDIS_URL"


@dataclass(frozen=True, slots=True)
class ClusterUrl:
    """The parts of a ``redis+cluster://`` URL."""

    seeds: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    tls: bool


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def is_cluster(redis: object) -> bool:
    return isinstance(redis, RedisCluster)


def parse_cluster_url(url: str) -> ClusterUrl:
    """Split a cluster URL into its seeds and credentials; ConfigError naming the setting."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in CLUSTER_SCHEMES:
        raise ConfigError(f"{_SETTING}: not a redis+cluster:// URL", setting=_SETTING)
    rest, _, query = rest.partition("?")
    if query:
        raise ConfigError(f"{_SETTING}: a cluster URL takes no query options "
                          f"(use the BATON_REDIS_* settings)", setting=_SETTING)
    hosts, _, path = rest.partition("/")
    if path not in ("", "0"):
        raise ConfigError(f"{_SETTING}: a Redis Cluster has only database 0, not /{path}",
                          setting=_SETTING)
    userinfo, at, hosts = hosts.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username, password = (unquote(user) or None), (unquote(secret) if colon else None)
    seeds = []
    for item in hosts.split(","):
        host, colon, port = item.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{_SETTING}: cluster seed {item.strip()!r} is not host:port",
                              setting=_SETTING)
        seeds.append((host.strip("[]"), int(port)))
    return ClusterUrl(tuple(seeds), username, password, scheme.lower() == "rediss+cluster")


def connect_redis(settings: Settings, *, socket_timeout: float | None = 10.0,
                  client_name: str | None = None) -> Redis:
    """A client that fails fast and never retries on its own.

    Automatic retries are off on purpose: re-sending a commit whose reply was lost could
    apply it twice. Callers decide what is safe to retry (submit is idempotent, a Brain
    re-acquires and reloads, a Hands attempt re-checks its run).

    The pool is a blocking one: past ``redis_max_connections`` a caller waits for a free
    connection (up to the connect timeout) instead of failing at once, as a burst of
    concurrent tool runs and heartbeats would otherwise make it.

    For a ``redis+cluster://`` URL the client is a :class:`RedisCluster` (see
    :func:`connect_cluster`), typed as ``Redis`` because it offers the same commands to the
    store; :data:`AnyRedis` is the honest type for new code.
    """
    if is_cluster_url(settings.redis_url):
        return cast(Redis, connect_cluster(settings, socket_timeout=socket_timeout,
                                           client_name=client_name))
    db = urlsplit(settings.redis_url).path.strip("/")
    if db not in ("", "0"):
        # The roles' ACLs grant no SELECT (baton.auth): keep tenants apart by namespace
        # (key patterns) or by server, not by database.
        raise ConfigError(f"{_SETTING}: Baton works in database 0, not /{db}: give each "
                          "tenant its own namespace (BATON_NAMESPACE) or its own server",
                          setting=_SETTING)
    pool = BlockingConnectionPool.from_url(
        settings.redis_url,
        max_connections=settings.redis_max_connections,
        timeout=max(settings.connect_timeout_s, 5.0),
        decode_responses=True,
        socket_connect_timeout=settings.connect_timeout_s,
        socket_timeout=socket_timeout,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=30,
        **_named(client_name),
        **_tls_options(settings),
    )
    return Redis.from_pool(pool)  # the client owns the pool: aclose() closes it


def connect_cluster(settings: Settings, *, socket_timeout: float | None = 10.0,
                    client_name: str | None = None) -> RedisCluster:
    """A :class:`RedisCluster` client with the same no-retry policy as a single server.

    MOVED and ASK redirections are still followed (the command did not run there); an
    error that may leave a command applied (a lost reply, a dead node) is raised to the
    caller. ``require_full_coverage`` is off so that, during a failover, the slots of the
    live primaries keep serving; full coverage is checked once, when the client first
    connects (:class:`_Cluster`). Seeds whose names resolve nowhere are a ConfigError here.
    """
    parsed = parse_cluster_url(settings.redis_url)
    _check_resolves(parsed)
    cluster = _Cluster(
        startup_nodes=[ClusterNode(host, port) for host, port in parsed.seeds],
        username=parsed.username,
        password=parsed.password,
        require_full_coverage=False,
        retry=Retry(NoBackoff(), 0),
        max_connections=settings.redis_max_connections,  # per node
        decode_responses=True,
        socket_connect_timeout=settings.connect_timeout_s,
        socket_timeout=socket_timeout,
        health_check_interval=30,
        **_named(client_name),
        **({"ssl": True, **_tls_options(settings)} if parsed.tls else _tls_options(settings)),
    )
    cluster.min_replicas = settings.min_replicas()
    return cluster


class _Cluster(RedisCluster):
    """RedisCluster whose first topology load checks the cluster is whole.

    All seeds unreachable stays a connection error (retryable: the cluster may be
    starting); a cluster that answers with slots unassigned is a ConfigError, so a worker
    does not start against half a store, and so is one where a primary has fewer replicas
    than ``min_replicas`` (``BATON_REDIS_MIN_REPLICAS``): no write there could ever be
    acknowledged.
    """

    _coverage_checked = False
    min_replicas = 0

    async def initialize(
        self,
        additional_startup_nodes_info: list[tuple[str, int]] | None = None,
        last_failed_node_name: str | None = None,
    ) -> RedisCluster:
        covered = -1
        try:
            await super().initialize(additional_startup_nodes_info, last_failed_node_name)
        except RedisClusterException as exc:
            # redis-py's "cannot be connected" is not a RedisError: make it one.
            raise RedisConnectionError(f"Redis Cluster unreachable: {exc}") from None
        except IndexError:  # redis-py's answer to a cluster whose nodes serve no slot
            if self._coverage_checked:
                raise RedisConnectionError("Redis Cluster: no node serves a slot") from None
            covered = 0
        if not self._coverage_checked:
            if covered < 0:
                covered = sum(1 for s in range(SLOTS) if self.nodes_manager.slots_cache.get(s))
            if covered < SLOTS:
                await super().aclose()
                raise ConfigError(
                    f"{_SETTING}: the Redis Cluster assigns {covered} of {SLOTS} slots; "
                    f"assign every slot (redis-cli --cluster fix) before starting Baton",
                    setting=_SETTING, covered=covered)
            short = await self._short_of_replicas()
            if short:
                await super().aclose()
                raise ConfigError(
                    f"BATON_REDIS_MIN_REPLICAS: {self.min_replicas} replica(s) must acknowledge "
                    f"each write, but {short} and no node is down; add a replica to it "
                    "(or lower the setting)",
                    setting="BATON_REDIS_MIN_REPLICAS", wanted=self.min_replicas)
            self._coverage_checked = True
        return self

    async def _short_of_replicas(self) -> str:
        """Which primary has fewer replicas than required ("" when none).

        Counted from ``CLUSTER NODES`` of every node, failed replicas included (one that is
        down now may come back; one that was never added cannot), each primary's count the
        highest any node reports: gossip spreads a new replica's role over a moment, so a
        shortfall is also looked at again for a while before it is believed.
        """
        if self.min_replicas <= 0:
            return ""
        deadline = time.monotonic() + _REPLICA_GOSSIP_S
        while True:
            primaries: dict[str, str] = {}
            counts: dict[str, int] = {}
            failed: set[str] = set()
            answered = 0
            for node in list(self.nodes_manager.nodes_cache.values()):
                # Straight to each node: the client's own command path would re-enter
                # initialize() on an error.
                try:
                    text = await node.execute_command("CLUSTER", "NODES")
                except (RedisError, OSError):
                    continue
                answered += 1
                view_primaries, view_counts, view_failed = _replicas_per_primary(str(text))
                failed |= view_failed
                for node_id, address in view_primaries.items():
                    if address and not address.startswith(":"):
                        primaries[node_id] = address
                    primaries.setdefault(node_id, address)
                    counts[node_id] = max(counts.get(node_id, 0), view_counts.get(node_id, 0))
            if not answered:  # retryable: checked again at the next start
                raise RedisConnectionError("Redis Cluster: no node answered CLUSTER NODES")
            fewest = min(primaries, key=lambda n: counts.get(n, 0), default=None)
            short = ("" if fewest is None or counts.get(fewest, 0) >= self.min_replicas
                     else f"primary {primaries[fewest]} has {counts.get(fewest, 0)}")
            if short and failed:
                # An outage, not a configuration: a primary failed and its replica took
                # over, with no replica of its own until the failed node is back. Starting
                # now is what a restart or a rolling deploy needs; the writes to that
                # primary's slots wait (refused, retried) until a replica is back.
                from baton.observability.log import get_logger  # not on `health`'s path

                get_logger("baton.store").warning(
                    "redis_cluster_short_of_replicas", detail=short,
                    failed_nodes=sorted(failed), min_replicas=self.min_replicas,
                    effect="writes to that primary's slots are refused until a replica is "
                           "back: restore or replace the failed node")
                return ""
            if not short or time.monotonic() > deadline:
                return short
            await asyncio.sleep(0.1)  # gossip spreading the replicas: look again


async def run_batch(redis: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Commands in one round trip, without a transaction: redis-py's pipeline, each reply
    in its place (parsed as the command's own call parses it), an error reply as its
    exception (a connection error is raised). On a cluster the commands must share a slot
    unless they are plain reads and writes the cluster pipeline routes (it refuses
    scripts)."""
    async with redis.pipeline(transaction=False) as pipe:
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute(raise_on_error=False))


def _replicas_per_primary(nodes_text: str
                          ) -> tuple[dict[str, str], dict[str, int], set[str]]:
    """One node's view: primaries serving slots (id -> address), replicas per primary id,
    and the addresses of the nodes it sees failed (or possibly failed)."""
    primaries: dict[str, str] = {}
    replicas: dict[str, int] = {}
    failed: set[str] = set()
    for line in nodes_text.strip().splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        flags = parts[2].split(",")
        if "fail" in flags or "fail?" in flags:
            failed.add(parts[1].split("@", 1)[0])
        if "master" in flags and len(parts) > 8:
            primaries[parts[0]] = parts[1].split("@", 1)[0]
        elif "slave" in flags and parts[3] != "-":
            replicas[parts[3]] = replicas.get(parts[3], 0) + 1
    return primaries, replicas, failed


def _check_resolves(parsed: ClusterUrl) -> None:
    for host, port in parsed.seeds:
        try:
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            return
        except OSError:
            continue
    names = ", ".join(f"{h}:{p}" for h, p in parsed.seeds)
    raise ConfigError(f"{_SETTING}: no cluster seed resolves to an address ({names})",
                      setting=_SETTING)


def _named(client_name: str | None) -> dict[str, Any]:
    """The CLIENT SETNAME option, when a name is given (operators find the connection)."""
    return {"client_name": client_name} if client_name else {}


def _tls_options(settings: Settings) -> dict[str, Any]:
    """TLS files for a ``rediss://`` URL (a CA bundle, and a client cert for mutual TLS)."""
    s = settings
    files = {"ssl_ca_certs": s.redis_tls_ca, "ssl_certfile": s.redis_tls_cert,
             "ssl_keyfile": s.redis_tls_key}
    if not s.redis_url.startswith(("rediss://", "rediss+cluster://")):
        if any(files.values()):
            raise ConfigError("BATON_REDIS_TLS_* is set but BATON_REDIS_URL is not rediss://")
        return {}
    return {k: v for k, v in files.items() if v}


def without_password(url: str) -> str:
    """``url`` fit for messages and logs: the user kept, the password dropped."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, hosts = rest.rpartition("@")
    if not sep or not at:
        return url
    user = userinfo.partition(":")[0]  # redis://:password@host names no user: none shown
    return f"{scheme}://{user}@{hosts}" if user else f"{scheme}://{hosts}"


def redis_user(settings: Settings) -> str:
    """The ACL user of the Redis URL ("default" when none is named)."""
    if is_cluster_url(settings.redis_url):
        return parse_cluster_url(settings.redis_url).username or "default"
    return urlsplit(settings.redis_url).username or "default"


__all__ = ["REDIS_ERRORS", "AnyRedis", "ClusterUrl", "connect_cluster", "connect_redis",
           "is_cluster", "is_cluster_url", "parse_cluster_url", "redis_user", "run_batch",
           "without_password"]
