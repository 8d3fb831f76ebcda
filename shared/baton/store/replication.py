"""A write is acknowledged only once a replica has it: ``WAIT`` on the write's own connection.

On a Redis Cluster a primary answers a script before its replica has the writes; if the
primary dies then, its promoted replica never had them and an acknowledged commit is lost.
:class:`ReplicatedWrites` sends each transition script and ``WAIT numreplicas timeout`` in one
pipeline to the node serving the session's slot, so both run on one connection, in order
(``WAIT`` counts the replicas that acknowledged that connection's last write).

A write whose acknowledgement did not come (``WAIT`` answered fewer replicas, or the node
dropped the connection after the script) is *in doubt*: it may survive or vanish with a
failover. It is retried, for up to ``redis_in_doubt_retry_ms``, with the same **commit id**:
the script wrapper (see ``_applied.lua``) returns the original reply of a commit id it has
already applied, without writing again, and touches the applied record so that the ``WAIT``
after the retry also covers the original write. Past the budget the caller gets
:class:`~baton.errors.WriteInDoubtError` and must not act on the write (publish, reply,
execute); its own later retry goes through its usual idempotent path (a re-acquire and
reload, a re-claim, a resubmit with the same request id).

Replies that prove the script did not run (``NOSCRIPT``, ``MOVED``/``ASK``/``TRYAGAIN``
and ``CLUSTERDOWN`` during a failover, ``NOREPLICAS`` from a primary whose
``min-replicas-to-write`` guard refuses writes, ``READONLY`` from a node that became a
replica) are retried the same way but are never in doubt. A connection error in the
script's own reply (the node died with the script in flight) is in doubt, as one raised.

Past the budget a refused write fails with one sentence naming the session, the slot and the
node serving it, how long it was retried and the last reason; the
:class:`~baton.errors.RedisUnavailable` carries them as fields (``slot``, ``node``,
``cause``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    MovedError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from baton.errors import RedisUnavailable, WriteInDoubtError
from baton.observability.log import get_logger
from baton.store.redis_client import is_cluster

__all__ = ["Reads", "ReplicatedWrites", "refused_for_now", "shard_of", "where"]

log = get_logger("baton.store.replication")

#: Queues read commands after the write, on the same connection (one round trip).
Reads = Callable[[Any], None]

_NOT_RUN = (MovedError, AskError)
_LOST = (RedisConnectionError, RedisTimeoutError, OSError, RedisClusterException)
#: Error replies of a node that refused a write for now, before running it: a failover
#: (CLUSTERDOWN, MASTERDOWN, TRYAGAIN), a node that turned replica (READONLY) or is loading
#: its data (LOADING, a ConnectionError to redis-py); and the split-brain guard, NOREPLICAS,
#: which redis-py has no class for.
_REFUSED_FOR_NOW = (ClusterDownError, MasterDownError, TryAgainError, ReadOnlyError,
                    BusyLoadingError)
_REFRESH_GAP_S = 0.2


class Script(Protocol):
    """A script as :class:`ReplicatedWrites` runs it (baton.store.scripts.Function)."""

    def command(self, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]: ...

    async def load(self) -> None: ...


def missing(reply: object) -> bool:
    """Whether a reply says the server has no such function: the library is not loaded
    there (a server that never had it, a node restarted empty). Nothing ran then."""
    return isinstance(reply, ResponseError) and "function not found" in str(reply).lower()


class ReplicatedWrites:
    """Runs a script, then ``WAIT``, on the connection of the node serving its keys."""

    def __init__(self, redis: Any, *, min_replicas: int, timeout_ms: int, retry_ms: int) -> None:
        # Any: a redis.asyncio Redis or RedisCluster (their pipelines differ only in routing).
        self.redis = redis
        self.cluster = is_cluster(redis)
        self.min_replicas = min_replicas
        self.timeout_ms = timeout_ms
        self.retry_ms = retry_ms
        self._refresh_lock = asyncio.Lock()
        self._refreshed_at = 0.0

    async def run(
        self, script: Script, keys: list[str], args: list[Any], *, commit_id: str,
        what: str, session_id: str = "", reads: Reads | None = None,
    ) -> tuple[Any, list[Any]]:
        """The script's reply (an exception reply is raised as is) and the reads' results.

        Raises :class:`WriteInDoubtError` when no attempt within the budget was acknowledged
        but one may have been applied, :class:`RedisUnavailable` when none was applied.
        """
        deadline = time.monotonic() + self.retry_ms / 1000
        delay, doubt, reason = 0.02, False, ""
        while True:
            try:
                results = await self._attempt(script, keys, args, reads)
            except _LOST as exc:  # the script may have run before the connection dropped
                doubt, reason = True, f"connection lost: {exc}"
            else:
                reply, acked = results[0], results[1]
                if missing(reply):  # the library is not on that node: nothing ran
                    await script.load()
                    continue
                if isinstance(reply, _NOT_RUN) or refused_for_now(reply):
                    reason = f"not applied: {reply}"
                elif isinstance(reply, _LOST):  # in the pipeline's replies: may have run
                    doubt, reason = True, f"connection lost: {reply}"
                elif isinstance(reply, Exception):
                    raise reply
                elif isinstance(acked, Exception) or int(acked) < self.min_replicas:
                    doubt = True
                    reason = (f"{acked} of {self.min_replicas} replica(s) acknowledged within "
                              f"{self.timeout_ms} ms")
                else:
                    return reply, list(results[2:])
            if time.monotonic() + delay > deadline:
                break
            log.warning("write_unacknowledged_retrying", what=what, session_id=session_id,
                        commit_id=commit_id, reason=reason)
            await asyncio.sleep(delay)  # backoff between attempts, not a wait for an event
            delay = min(delay * 2, 0.5)
            await self._refresh()
        slot, node = shard_of(self.redis, keys[0]) if keys else (None, "")
        log.error("write_in_doubt" if doubt else "write_refused", what=what,
                  session_id=session_id, commit_id=commit_id, reason=reason, slot=slot,
                  node=node)
        if doubt:
            raise WriteInDoubtError(what, session_id=session_id, commit_id=commit_id,
                                    wanted=self.min_replicas, reason=reason, slot=slot,
                                    node=node)
        raise RedisUnavailable(
            f"redis refused {what} for session {session_id}{where(slot, node)} for "
            f"{self.retry_ms / 1000:g} s: {reason}", cause=reason, slot=slot, node=node)

    async def _attempt(
        self, script: Script, keys: list[str], args: list[Any], reads: Reads | None
    ) -> list[Any]:
        pipe = self.redis.pipeline(transaction=False)
        pipe.execute_command(*script.command(keys, args))
        if self.cluster:
            # WAIT has no key: pin it to the node the script goes to, so the cluster
            # pipeline sends both on that node's one connection.
            node = self.redis.get_node_from_key(keys[0])
            pipe.execute_command("WAIT", self.min_replicas, self.timeout_ms, target_nodes=node)
        else:
            pipe.execute_command("WAIT", self.min_replicas, self.timeout_ms)
        if reads is not None:
            reads(pipe)
        if self.cluster:
            # No redirection: a MOVED script is re-sent by us, with its WAIT beside it.
            return list(await pipe.execute(raise_on_error=False, allow_redirections=False))
        return list(await pipe.execute(raise_on_error=False))

    async def _refresh(self) -> None:
        """Reload the cluster's slot map (a failover moves slots to the promoted replica).

        One reload at a time, and none within :data:`_REFRESH_GAP_S` of the last: a reload
        replaces every node object and closes the old nodes' connections, under the
        commands other writers have in flight on them, so a wave of writers failing at
        once must not reload the map once each.
        """
        if not self.cluster:
            return
        async with self._refresh_lock:
            if time.monotonic() - self._refreshed_at < _REFRESH_GAP_S:
                return
            try:
                await self.redis.nodes_manager.initialize()
            except (RedisError, OSError, RedisClusterException, IndexError) as exc:
                log.debug("cluster_topology_refresh_failed", error=str(exc))
            self._refreshed_at = time.monotonic()


def refused_for_now(reply: Any) -> bool:
    """A node refused the write before running it, for a reason that passes by itself
    (:data:`_REFUSED_FOR_NOW`): the split-brain guard, a failover, a demoted primary."""
    return isinstance(reply, _REFUSED_FOR_NOW) or (
        isinstance(reply, ResponseError) and "NOREPLICAS" in str(reply))


def shard_of(redis: Any, key: str) -> tuple[int | None, str]:
    """(slot, ``host:port`` of the node serving it, as this client's slot map has it) for a
    key on a Redis Cluster; (None, "") on one server or without a slot map (the cluster
    down: the reason then says so)."""
    if not is_cluster(redis):
        return None, ""
    try:
        slot = int(redis.keyslot(key))
        node = redis.get_node_from_key(key)
    except (RedisClusterException, IndexError):
        return None, ""
    return slot, (f"{node.host}:{node.port}" if node is not None else "")


def where(slot: int | None, node: str) -> str:
    """`` (slot S on host:port)``, or what of it is known, for a sentence."""
    if slot is None:
        return ""
    return f" (slot {slot} on {node})" if node else f" (slot {slot})"
