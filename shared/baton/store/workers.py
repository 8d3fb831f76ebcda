"""Who is alive: the services' announcements in the per-shard ``<ns>:{<ns>-N}:workers``.

Every service writes ``role:name -> {role, name, pid, seen_ms, inflight, ...}`` into the
hash of the shard its field hashes to (:meth:`Keys.workers`), every
:data:`ANNOUNCE_EVERY_S` while it runs
(:meth:`baton.service.Service.announce`) and deletes it when it stops. A worker killed
before it could delete its record leaves it behind, shown as gone; every
:data:`PRUNE_EVERY_S` each live service deletes the records of its own role silent for
longer than ``dead_worker_keep_s`` (:func:`prune_gone`), so the hashes hold the live workers
and those gone within that time, however many names (``role-host-pid``) came and went. A
Brain adds ``serves``, the ``[agent, compat level]`` pairs whose wakes it consumes, and
``kinds``, the task kinds it runs with their versions. Read by
``inspect`` (services, sessions no live Brain serves) and by ``baton submit`` (a warning
before input waits for a Brain that is not there), and by relays counting each other
(:mod:`baton.relay.leases`). Split over the shards so that on a Redis Cluster the
heartbeats of many workers do not all land on one slot; a reader scans every shard (one
pipelined HGETALL per shard).
"""

from __future__ import annotations

import json
from typing import Any

from baton.errors import ValidationError
from baton.models import loads
from baton.store.keys import Keys
from baton.store.state import is_request

__all__ = ["ANNOUNCE_EVERY_S", "PRUNE_EVERY_S", "SERVICE_STALE_MS", "all_services",
           "live_brains", "prune_gone", "served_levels", "services", "session_level",
           "unknown_kind", "unserved"]

SERVICE_STALE_MS = 10_000  # silent this long = probably gone
#: How often a service announces itself: three times per stale age, so one lost or late
#: announcement never makes a live service look gone. Each one wakes the service and Redis.
ANNOUNCE_EVERY_S = SERVICE_STALE_MS / 3000
#: How often a service deletes its role's records of workers gone for ``dead_worker_keep_s``
#: (one HGETALL per shard: rare, beside the announcements).
PRUNE_EVERY_S = 600.0


async def all_services(redis: Any, keys: Keys, now: int,
                       role: str | None = None) -> list[dict[str, Any]]:
    """Every announcement of every shard (only ``role``'s, if given), with ``seen_age_ms``
    and ``alive`` (seen within the stale age)."""
    async with redis.pipeline(transaction=False) as p:
        for key in keys.every("workers", role):
            p.hgetall(key)
        replies = await p.execute()
    found = []
    for reply in replies:
        for raw in reply.values():
            info = loads(raw)
            age = now - int(info.get("seen_ms", 0))
            found.append({**info, "seen_age_ms": age, "alive": age < SERVICE_STALE_MS})
    return found


services = all_services  # the name inspect and the client import


async def prune_gone(redis: Any, keys: Keys, role: str, now: int, keep_ms: int) -> list[str]:
    """Delete ``role``'s liveness records not renewed for more than ``keep_ms`` (a record
    that does not decode counts as never seen), over every shard; returns their fields.

    Each role may write only its own records (its ACL), so each prunes its own. A record
    renewed between the read and the delete is gone until the next announcement, a few
    seconds: only a worker silent for ``keep_ms`` and back at that instant can lose it."""
    hashes = keys.every("workers", role)
    async with redis.pipeline(transaction=False) as p:
        for key in hashes:
            p.hgetall(key)
        replies = await p.execute()
    gone: dict[str, list[str]] = {}
    for key, reply in zip(hashes, replies, strict=True):
        for field, raw in reply.items():
            try:
                seen = int(loads(raw).get("seen_ms", 0))
            except (ValidationError, ValueError, TypeError, AttributeError):
                seen = 0
            if now - seen > keep_ms:
                gone.setdefault(key, []).append(field)
    if gone:
        async with redis.pipeline(transaction=False) as p:
            for key, fields in gone.items():
                p.hdel(key, *fields)
            await p.execute()
    return [str(f) for fields in gone.values() for f in fields]


def served_levels(announced: list[dict[str, Any]]) -> set[tuple[str, int]]:
    """(agent, compat level) pairs some live Brain consumes wakes for."""
    return {(str(a), int(c)) for s in announced if s.get("role") == "brain" and s["alive"]
            for a, c in s.get("serves", ())}


def live_brains(announced: list[dict[str, Any]], agent: str, compat: int) -> list[str]:
    """Names of the live Brains serving ``agent`` at ``compat``."""
    return sorted(str(s["name"]) for s in announced
                  if s.get("role") == "brain" and s["alive"]
                  and [agent, compat] in [[str(a), int(c)] for a, c in s.get("serves", ())])


async def session_level(redis: Any, keys: Keys, session_id: str) -> tuple[str, int] | None:
    """The agent and compat level a session is served at: its own (a migration moves it),
    or for a session not opened yet, that of the request that will open it; None when
    neither is known."""
    sk = keys.session(session_id)
    agent, compat = await redis.hmget(sk.meta, ["agent", "compat"])
    if agent and compat:
        return str(agent), int(compat)
    for field, raw in sorted((await redis.hgetall(sk.inbox)).items()):
        if is_request(str(field)):
            try:
                request = json.loads(raw)
            except ValueError:
                continue
            if isinstance(request, dict) and isinstance(request.get("agent"), str):
                return request["agent"], int(request.get("compat") or 1)
    return None


async def unserved(redis: Any, keys: Keys, now: int, agent: str, compat: int,
                   session_id: str | None = None) -> str:
    """Why input for ``agent`` at ``compat`` (or for the session's own level) would wait: no
    live Brain serves it; "" when one does."""
    if session_id and (level := await session_level(redis, keys, session_id)) is not None:
        agent, compat = level
    if live_brains(await services(redis, keys, now), agent, compat):
        return ""
    return (f"no live Brain serves agent {agent} at compat level {compat} in namespace "
            f"{keys.ns}")


def unknown_kind(announced: list[dict[str, Any]], agent: str, compat: int, kind: str) -> str:
    """Why a task of ``kind`` for ``agent`` at ``compat`` would wait blocked: the live Brains
    serving that level announce kinds and none knows it; "" otherwise (none serves it:
    :func:`unserved` says so; or a Brain of a version that announces no kinds)."""
    serving = [s for s in announced if s.get("role") == "brain" and s["alive"]
               and [agent, compat] in [[str(a), int(c)] for a, c in s.get("serves", ())]]
    if not serving or any("kinds" not in s or kind in s["kinds"] for s in serving):
        return ""
    return (f"no live Brain serving agent {agent} at compat level {compat} knows task kind "
            f"{kind!r} (they run {', '.join(sorted({k for s in serving for k in s['kinds']}))})")
