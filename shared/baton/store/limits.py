"""Fleet-wide limits of a tool: a concurrency cap and a rate, held in Redis for every Hands.

Each Hands replica runs up to ``hands_concurrency`` runs of a tool; a mail service or a
payments API allows far fewer for the whole fleet. A tool declares its limits once
(:class:`~baton.limits.ToolLimit`), and every run of it, in whichever Hands, takes a slot
and an admission at the rate from one place, ``tool_limit.lua`` (keys:
:meth:`~baton.store.keys.Keys.tool_limit`):

- **slots**: at most ``max_concurrency`` runs hold one at a time. A holder renews its slot
  while it executes and releases it when done; a holder that died stops renewing, and its
  slot is free once the slot time passed (on Redis' clock), so no slot is lost for good and
  none is granted twice while its holder lives. Runs wait in arrival order within a tenant,
  tenants with runs waiting taking turns by weight (the session's tenant, see
  :mod:`baton.store.admission`): a run keeps its place by asking again (each answer says
  when, at the latest), and is dropped from the queue when it stops asking (its Hands died).
- **rate**: admissions at most ``per_second`` a second, ``burst`` at once, by the generic
  cell rate algorithm (one stored time, the theoretical arrival time), taken with the slot
  in the same order.

Waiting costs no polling: :meth:`Limits.acquire` says how long a run may wait before it asks
again (a slot's expiry, the rate's next admission), and a release names the waiting runs
that may take the freed slots (:meth:`Limits.release`): the caller tells those, and only
those, to ask again, so a release costs one more acquire however long the line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from redis.asyncio import Redis

from baton.errors import from_redis_error
from baton.limits import ToolLimit
from baton.store.admission import LINE_COUNTED, by_tenant
from baton.store.keys import Keys
from baton.store.redis_client import REDIS_ERRORS
from baton.store.scripts import Scripts

__all__ = ["Admission", "Limits", "Usage"]

@dataclass(frozen=True, slots=True)
class Admission:
    """An answer to :meth:`Limits.acquire`."""

    granted: bool
    #: 1-based place among the runs waiting for a slot; 0 when granted, or when first in
    #: line and waiting for the rate only.
    position: int = 0
    #: Ask again at the latest after this long (ms): a slot's expiry, the rate's next
    #: admission; a release announced earlier is reason to ask sooner.
    retry_ms: int = 0


@dataclass(frozen=True, slots=True)
class Usage:
    """A tool's limits now (:meth:`Limits.look`)."""

    in_use: int
    waiting: int
    rate_wait_ms: int
    #: Slots held and runs in line, by the tenant of their sessions.
    in_use_by_tenant: dict[str, int] = field(default_factory=dict)
    waiting_by_tenant: dict[str, int] = field(default_factory=dict)


class Limits:
    """The fleet-wide limits of tools, on one Redis client. ``slot_ms``: how long a slot
    lasts unless renewed (its holder renews it well within, as it heartbeats its run)."""

    def __init__(self, redis: Redis, keys: Keys, *, slot_ms: int) -> None:
        self.redis, self.keys, self.slot_ms = redis, keys, slot_ms
        self._script = Scripts(redis).tool_limit

    async def _call(self, op: str, tool: str, limit: ToolLimit, member: str,
                    tenant: str = "", weight: int = 1) -> list[int | str]:
        try:
            reply = await self._script(
                keys=self.keys.tool_limit(tool),
                args=[op, member, limit.max_concurrency, self.slot_ms, limit.interval_ms,
                      limit.burst, tenant, weight])
        except REDIS_ERRORS as exc:
            raise from_redis_error(exc, role="hands", namespace=self.keys.ns) from exc
        return [v.decode() if isinstance(v, bytes) else v for v in reply]

    async def acquire(self, tool: str, limit: ToolLimit, member: str, *, tenant: str = "",
                      weight: int = 1) -> Admission:
        """Take a slot (and the rate's admission) for run ``member``, or its place in line:
        in order of arrival within ``tenant``, tenants with runs waiting taking turns in
        proportion to their ``weight`` (start-time fair queuing, see tool_limit.lua)."""
        granted, position, retry = await self._call("acquire", tool, limit, member, tenant,
                                                    weight)
        return Admission(bool(granted), int(position), int(retry))

    async def renew(self, tool: str, limit: ToolLimit, member: str) -> bool:
        """Extend ``member``'s slot; False when it holds none (it expired)."""
        return bool((await self._call("renew", tool, limit, member))[0])

    async def release(self, tool: str, limit: ToolLimit, member: str) -> list[str]:
        """Give up ``member``'s slot or place in line; the waiting runs that may take a
        slot now (the first of the line, as many as slots are free): the caller tells
        them, and only them, to ask again."""
        return [str(m) for m in (await self._call("release", tool, limit, member))[2:]]

    async def look(self, tool: str, limit: ToolLimit) -> Usage:
        """Slots in use, runs waiting and the wait for the rate's next admission (ms): read
        commands only (the operator, who runs no script, may look), all on one slot."""
        slots, waiting, _, _, tat = self.keys.tool_limit(tool)
        try:
            sec, usec = await self.redis.time()
            now = int(sec) * 1000 + int(usec) // 1000
            async with self.redis.pipeline(transaction=False) as p:
                p.zcount(slots, f"({now}", "+inf")
                p.zcard(waiting)
                p.get(tat)
                p.zrangebyscore(slots, f"({now}", "+inf", start=0, num=LINE_COUNTED)
                p.zrange(waiting, 0, LINE_COUNTED - 1)
                used, queued, stored, holders, line = await p.execute()
        except REDIS_ERRORS as exc:
            raise from_redis_error(exc, role="operator", namespace=self.keys.ns) from exc
        wait = 0
        if limit.interval_ms:  # as tool_limit.lua's rate_wait()
            tat_ms = max(int(float(stored or 0)), now)
            wait = max(tat_ms + limit.interval_ms - limit.burst * limit.interval_ms - now, 0)
        return Usage(int(used), int(queued), wait, by_tenant(holders), by_tenant(line))
