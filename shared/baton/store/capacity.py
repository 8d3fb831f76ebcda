"""What keeps a full Redis from losing acknowledged work.

Redis holds every session in memory. Two settings of the server decide what happens when
that memory runs out:

* ``maxmemory-policy``: anything but ``noeviction`` lets Redis *delete keys* to make room,
  and a deleted session key is a lost session (a commit the client was told about, gone).
  :func:`refuse_eviction` refuses such a server when a process starts (one ``error:`` line
  naming the setting), before anything is written.
* with ``noeviction`` a full Redis refuses writes instead (``OOM command not allowed``), and
  one that cannot write its append-only file refuses them too (``MISCONF``). Baton's scripts
  check everything before their first write, so a refused script wrote nothing; the error is
  :class:`~baton.errors.StoreFullError` (retryable): the client and the API refuse new input
  with it (HTTP 503 and ``Retry-After``), workers back off and retry, and work resumes by
  itself once there is room again.
* JetStream refusing the relay's messages for want of room (a stream at its message or byte
  limit, a server out of storage): the relay keeps the rows in the outbox and retries, and
  says so in each shard's ``full`` key for a few seconds at each refusal
  (:func:`mark_bus_full`); ``submit.lua`` and ``start.lua`` refuse new input meanwhile with
  ``FULL`` (a :class:`~baton.errors.StoreFullError`, reason ``bus``), so a backlog cannot
  grow in Redis without bound while nothing drains it.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import NoPermissionError, ResponseError

from baton.errors import ConfigError
from baton.observability.log import get_logger
from baton.store.redis_client import REDIS_ERRORS, is_cluster

__all__ = ["FULL_TTL_MS", "mark_bus_full", "refuse_eviction", "stream_full"]

#: How long a relay's mark that JetStream is full lasts unless said again: a relay that
#: keeps failing says it at each retry; once a publish goes through it is gone by then.
FULL_TTL_MS = 5_000

log = get_logger("baton.store.capacity")

_SAFE = "noeviction"


async def _memory_info(redis: Any) -> dict[str, dict[str, Any]]:
    """INFO memory of the server, or of each primary of a cluster, by node name."""
    if is_cluster(redis):
        found = await redis.info("memory", target_nodes=redis.PRIMARIES)
        if found and all(isinstance(v, dict) for v in found.values()) \
                and "maxmemory_policy" not in found:
            return dict(found)
        return {"cluster": found}
    return {"": await redis.info("memory")}


async def refuse_eviction(redis: Any) -> None:
    """ConfigError when a Redis server Baton writes to may evict keys.

    A server that does not let this user run INFO is not checked (logged once); one that
    cannot be reached is the caller's to retry (its error is raised as it is)."""
    try:
        infos = await _memory_info(redis)
    except NoPermissionError as exc:
        log.warning("eviction_policy_unchecked", error=str(exc),
                    note="this Redis user may not run INFO: the maxmemory-policy is not "
                         "checked; make sure it is noeviction")
        return
    except ResponseError as exc:
        if "NOPERM" in str(exc) or "no permissions" in str(exc):
            log.warning("eviction_policy_unchecked", error=str(exc))
            return
        raise
    except REDIS_ERRORS:
        raise
    for node, info in infos.items():
        policy = str(info.get("maxmemory_policy", _SAFE))
        if policy != _SAFE:
            where = f"Redis {node}" if node else "Redis"
            raise ConfigError(
                f"{where} has maxmemory-policy {policy}: when its memory is full it deletes "
                f"keys, which would delete sessions; set maxmemory-policy noeviction (in "
                f"redis.conf, or CONFIG SET maxmemory-policy noeviction)",
                setting="maxmemory-policy", found=policy)


#: JetStream's error codes for a message refused for want of room: the stream's message or
#: byte limit (discard new), the server's storage (its max_file_store, its disk).
_FULL_CODES = frozenset({10077, 10047, 10028, 10023})


def stream_full(exc: BaseException) -> str:
    """Why JetStream refused a publish for want of room ("" when that is not why)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        code = getattr(exc, "err_code", None)
        text = str(getattr(exc, "description", "") or "")
        if code in _FULL_CODES or any(m in text for m in (
                "maximum messages exceeded", "maximum bytes exceeded", "insufficient")):
            return f"JetStream refused a message: {text or code}"
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return ""


async def mark_bus_full(redis: Any, keys: Any, reason: str) -> None:
    """Tell clients, shard by shard, that JetStream is full, for :data:`FULL_TTL_MS`."""
    async with redis.pipeline(transaction=False) as pipe:
        for shard in range(keys.shards):
            pipe.set(keys.full(shard), reason[:200], px=FULL_TTL_MS)
        await pipe.execute()
