"""Move Redis Cluster slots between primaries while Baton runs: resharding as a fault.

:func:`move_slot` does what ``redis-cli --cluster reshard`` does for one slot, in the order the
Redis Cluster specification gives: the target marks the slot ``IMPORTING``, the source
``MIGRATING``; the slot's keys go over ``batch`` at a time with ``MIGRATE``; then every primary
is told the slot's new owner (``CLUSTER SETSLOT <slot> NODE``). Between the first and the last
batch a session's keys are on two nodes: Baton's scripts declare every key they touch
(:func:`baton.store.scripts.script_keys`), so Redis redirects them (``ASK``, ``TRYAGAIN``)
until the slot has moved instead of letting them run on half a session. A small ``batch``
keeps sessions split for longer, which is what a test of that wants.

A move started is a move finished: a slot left ``MIGRATING`` on one node and ``IMPORTING`` on
another refuses every call on the sessions it splits (``TRYAGAIN``) until someone completes
it (``redis-cli --cluster fix``). So each step rides out what a loaded or changing cluster
answers for a while (a replica late to acknowledge makes the source refuse ``MIGRATE`` with
``NOREPLICAS``; a node restarting, ``LOADING``; ``IOERR`` or a timeout from a slow target)
until ``patience`` runs out, and only then fails, naming the slot and how it was left.

Used by ``baton chaos --cluster --reshard N`` and the resharding tests; it moves the slots of
Baton's shards (:func:`shard_slots`), which hold all of a namespace's keys.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis import exceptions as rx
from redis.asyncio import Redis
from redis.crc import key_slot

from baton.devkit.redis_cluster import RedisClusterNode, RedisClusterServers
from baton.errors import RedisUnavailable
from baton.observability.log import error_text, get_logger
from baton.store.keys import Keys

__all__ = ["move_slot", "shard_slots"]

log = get_logger("baton.dev")

# Refusals that pass: the step is tried again. Anything else (BUSYKEY: the target already has
# a key the source holds, a split no retry mends) fails the move at once.
_PASSING = (rx.ConnectionError, rx.TimeoutError, rx.TryAgainError, rx.ClusterDownError)
_PASSING_CODES = ("NOREPLICAS", "IOERR", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN")


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


def _passing(exc: Exception) -> bool:
    return isinstance(exc, _PASSING) or (isinstance(exc, rx.ResponseError)
                                         and str(exc).startswith(_PASSING_CODES))


async def _patiently(step: Callable[[], Awaitable[Any]], *, slot: int, what: str,
                     deadline: float) -> Any:
    """``step()``, again after a passing refusal (backing off to a second) until
    ``deadline`` (monotonic); then RedisUnavailable naming the slot and the step."""
    delay = 0.05
    while True:
        try:
            return await step()
        except rx.RedisError as exc:
            if not _passing(exc):
                raise
            if time.monotonic() + delay > deadline:
                raise RedisUnavailable(
                    f"moving slot {slot}: {what} still refused ({error_text(exc)}); the slot "
                    f"may be left MIGRATING/IMPORTING: complete it with `redis-cli --cluster "
                    f"fix`") from exc
            log.warning("reshard_step_retrying", slot=slot, step=what, error=error_text(exc))
            await asyncio.sleep(delay)  # a backoff between refusals, not a wait for a state
            delay = min(delay * 2, 1.0)


async def move_slot(servers: RedisClusterServers, slot: int, *, to: RedisClusterNode | None = None,
                    batch: int = 10, patience: float = 120.0) -> RedisClusterNode:
    """Move ``slot`` to primary ``to`` (default: the next primary after its owner, by port),
    ``batch`` keys per ``MIGRATE``; returns the new owner. Each step waits out passing
    refusals for up to ``patience`` seconds in all (see the module)."""
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
    deadline = time.monotonic() + patience

    async def step(node: Redis, what: str, *args: Any) -> Any:
        return await _patiently(lambda: node.execute_command(*args), slot=slot, what=what,
                                deadline=deadline)

    try:
        await step(dst, "SETSLOT IMPORTING", "CLUSTER", "SETSLOT", slot, "IMPORTING",
                   ids[source.port])
        await step(src, "SETSLOT MIGRATING", "CLUSTER", "SETSLOT", slot, "MIGRATING",
                   ids[to.port])
        auth = (["AUTH2", *source.credentials] if source.credentials else [])
        # A MIGRATE refused or timed out may have moved some keys: the next batch is read anew.
        while keys := await step(src, "GETKEYSINSLOT", "CLUSTER", "GETKEYSINSLOT", slot, batch):
            await step(src, "MIGRATE", "MIGRATE", to.host, to.port, "", 0, 10_000, *auth,
                       "KEYS", *keys)
        # The target first, then the source (as redis-cli does): the slot is never owned by
        # no one, and the other primaries learn it at once rather than by gossip.
        for node in (dst, src, *others):
            await step(node, "SETSLOT NODE", "CLUSTER", "SETSLOT", slot, "NODE", ids[to.port])
    finally:
        for r in (src, dst, *others):
            await r.aclose()
    return to
