"""Move Redis Cluster slots between primaries while Baton runs: resharding as a fault.

:func:`move_slot` does what ``redis-cli --cluster reshard`` does for one slot, in the order the
Redis Cluster specification gives: the target marks the slot ``IMPORTING``, the source
``MIGRATING``; the slot's keys go over ``batch`` at a time with ``MIGRATE``; then every primary
is told the slot's new owner (``CLUSTER SETSLOT <slot> NODE``). Between the first and the last
batch a session's keys are on two nodes: Baton's scripts declare every key they touch
(:func:`baton.store.scripts.script_keys`), so Redis redirects them (``ASK``, ``TRYAGAIN``)
until the slot has moved instead of letting them run on half a session. A small ``batch``
keeps sessions split for longer, which is what a test of that wants.

Used by ``baton chaos --cluster --reshard N`` and the resharding tests; it moves the slots of
Baton's shards (:func:`shard_slots`), which hold all of a namespace's keys.
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.crc import key_slot

from baton.devkit.redis_cluster import RedisClusterNode, RedisClusterServers
from baton.store.keys import Keys

__all__ = ["move_slot", "shard_slots"]


def shard_slots(namespace: str, shards: int) -> dict[int, int]:
    """Shard -> the Cluster slot of its hash tag (every key of the shard's sessions)."""
    keys = Keys(namespace, shards)
    return {s: key_slot(keys.timers(s).encode()) for s in range(shards)}


def _connect(node: RedisClusterNode) -> Redis:
    user, password = node.credentials or (None, None)
    tls: dict[str, object] = ({"ssl": True, "ssl_ca_certs": str(node.tls.ca)}
                              if node.tls is not None else {})
    return Redis(host=node.host, port=node.port, decode_responses=True, socket_timeout=10.0,
                 username=user, password=password, **tls)  # type: ignore[arg-type]


async def move_slot(servers: RedisClusterServers, slot: int, *, to: RedisClusterNode | None = None,
                    batch: int = 10) -> RedisClusterNode:
    """Move ``slot`` to primary ``to`` (default: the next primary after its owner, by port),
    ``batch`` keys per ``MIGRATE``; returns the new owner."""
    topo = await servers.topology()
    ids = {info.port: info.node_id for info in topo}
    primaries = sorted(info.port for info in topo
                       if info.role == "primary" and not info.failed and info.slots)
    source = await servers.primary_for_slot(slot)
    if to is None:
        later = [p for p in primaries if p > source.port]
        to = servers.node_at(later[0] if later else primaries[0])
    if to.port == source.port:
        return to
    src, dst = _connect(source), _connect(to)
    others = [_connect(servers.node_at(p)) for p in primaries if p not in (source.port, to.port)]
    try:
        await dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source.port])
        await src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to.port])
        auth = (["AUTH2", *source.credentials] if source.credentials else [])
        while keys := await src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
            await src.execute_command("MIGRATE", to.host, to.port, "", 0, 10_000, *auth,
                                      "KEYS", *keys)
        # The target first, then the source (as redis-cli does): the slot is never owned by
        # no one, and the other primaries learn it at once rather than by gossip.
        for node in (dst, src, *others):
            await node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[to.port])
    finally:
        for r in (src, dst, *others):
            await r.aclose()
    return to
