"""Fair admission of new sessions: tenants take turns, priorities go first, bounds at the edge.

Without admission (``admission_window`` 0) a new session's first wake goes to JetStream at
once, and Brains take wakes in arrival order: a tenant that submits 10,000 sessions delays
every other tenant's first answer by the whole burst. With it, each shard lets at most its
share of the window (:func:`shard_window`) of new sessions be *starting* at once (their
first wake written, no Brain has received it yet); the others wait in the shard's queue in
Redis, in order of priority (1 first, 5 last), then of fair share: start-time fair queuing,
where each tenant's next session starts at the later of the shard's virtual time and the
end of its previous share, and a share is ``1 / weight`` (``tenant_weights``). A tenant
arriving behind a burst therefore starts at the virtual time the burst has reached, ahead
of the burst's rest; tenants with waiting work take turns in proportion to their weights.

Everything a submission does is one script on the session's slot (``submit.lua``): the
request, its count as the tenant's waiting work, and either its wake row or its place in
the queue, atomically. A Brain that receives a first wake marked ``admitted`` calls
``admitted.lua`` on the shard (:meth:`AdmissionQueue.received`): the session no longer
waits, and the next in line get their wake rows in the shard's outbox. A starting session
no Brain received within ``admission_start_ms`` counts as received, so a lost wake or a
dead Brain cannot close the window; a request queued is never swept as lost by the relay
(``arm_requests.lua`` leaves the queue's sessions alone).

The bounds on waiting work (``max_waiting``, ``max_waiting_per_tenant``) are checked by the
client before it writes anything (:class:`AdmissionGate`): against every shard's counts,
read at most ``GATE_REFRESH_S`` ago and advanced by the client's own submissions since, so
concurrent clients may pass a bound by what they submit within that time.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from dataclasses import dataclass, field

from redis.asyncio import Redis

from baton.errors import BacklogFullError, ConfigError, from_redis_error
from baton.settings import Settings
from baton.store.keys import Keys
from baton.store.redis_client import REDIS_ERRORS
from baton.store.scripts import Scripts

__all__ = ["DEFAULT_PRIORITY", "LINE_COUNTED", "PRIORITIES", "TENANT", "AdmissionGate",
           "AdmissionQueue", "Backlog", "by_tenant", "check_priority", "check_tenant",
           "shard_window", "tenant_of_member", "weight_in", "weight_of"]

#: A tenant's name: 1 to 64 of letters, digits, ``_ . -``.
TENANT = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
#: Priorities of a submission: 1 first, 5 last; 3 by default.
PRIORITIES = range(1, 6)
DEFAULT_PRIORITY = 3
#: How old the counts the client checks its bounds against may be.
GATE_REFRESH_S = 0.25


#: How many members of a line (a tool's or a model's) a look counts by tenant.
LINE_COUNTED = 10_000


def tenant_of_member(member: object) -> str:
    """The tenant at the end of a limit line's member (``<call>/<worker>/<nonce>/<tenant>``,
    see baton.store.limits and baton.store.budgets); "default" for a member without one."""
    text = member.decode() if isinstance(member, bytes) else str(member)
    parts = text.split("/")
    return parts[3] if len(parts) >= 4 and TENANT.match(parts[3]) else "default"


def by_tenant(members: list[object]) -> dict[str, int]:
    """How many of ``members`` each tenant has (:func:`tenant_of_member`), by name."""
    counts: dict[str, int] = {}
    for m in members:
        tenant = tenant_of_member(m)
        counts[tenant] = counts.get(tenant, 0) + 1
    return dict(sorted(counts.items()))


def check_tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not TENANT.match(tenant):
        raise ConfigError(f"invalid tenant {str(tenant)[:70]!r}: 1 to 64 of A-Z a-z 0-9 _ . -")
    return tenant


def check_priority(priority: int) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int) or priority not in PRIORITIES:
        raise ConfigError(f"invalid priority {priority!r}: an integer from 1 (first) to 5 "
                          "(last)")
    return priority


def shard_window(settings: Settings) -> int:
    """Each shard's share of ``admission_window`` (0: admission off)."""
    if settings.admission_window <= 0:
        return 0
    return max(1, math.ceil(settings.admission_window / settings.shards))


def weight_of(settings: Settings, tenant: str) -> int:
    """``tenant``'s share from ``tenant_weights`` ("acme=3,globex=1"; 1 when not named)."""
    return weight_in(settings.tenant_weights, tenant)


def weight_in(weights: str, tenant: str) -> int:
    """``tenant``'s share in ``weights`` ("acme=3,globex=1"; 1 when not named)."""
    for part in filter(None, weights.split(",")):
        name, _, value = part.partition("=")
        if name == tenant:
            weight = int(value)
            if not 1 <= weight <= 100:
                raise ConfigError(f"tenant {tenant}'s weight {weight} is not from 1 to 100")
            return weight
    return 1


@dataclass(frozen=True, slots=True)
class Backlog:
    """New sessions waiting to start, over every shard."""

    waiting: int = 0  # queued or starting
    starting: int = 0  # first wake written, not received by a Brain yet
    queued: int = 0
    tenants: dict[str, int] = field(default_factory=dict)  # tenant -> waiting


class AdmissionQueue:
    """The shards' admission queues, on one Redis client."""

    def __init__(self, redis: Redis, keys: Keys, settings: Settings) -> None:
        self.redis, self.keys, self.settings = redis, keys, settings
        self._script = Scripts(redis).admitted

    async def received(self, session_id: str, *, role: str = "brain") -> int:
        """A Brain received the first wake of ``session_id``: its place goes to the next in
        line on its shard. Returns how many sessions were let through."""
        shard = self.keys.shard_of(session_id)
        window = shard_window(self.settings) or 1
        try:
            return int(await self._script(
                keys=[*self.keys.admission(shard), self.keys.outbox(shard)],
                args=[session_id, window, self.settings.admission_start_ms]))
        except REDIS_ERRORS as exc:
            raise from_redis_error(exc, role=role, namespace=self.keys.ns) from exc

    async def backlog(self) -> Backlog:
        """Every shard's counts (read commands only: the operator may look)."""
        try:
            async with self.redis.pipeline(transaction=False) as p:
                for shard in range(self.keys.shards):
                    adm, _, fly, queue = self.keys.admission(shard)
                    p.hgetall(adm)
                    p.zcard(fly)
                    p.zcard(queue)
                replies = await p.execute()
        except REDIS_ERRORS as exc:
            raise from_redis_error(exc, role="operator", namespace=self.keys.ns) from exc
        waiting = starting = queued = 0
        tenants: dict[str, int] = {}
        for i in range(0, len(replies), 3):
            state, fly, queue = replies[i:i + 3]
            starting += int(fly)
            queued += int(queue)
            for name, value in (state or {}).items():
                name = name.decode() if isinstance(name, bytes) else str(name)
                if name == "n":
                    waiting += int(value)
                elif name.startswith("n:") and int(value) > 0:
                    tenant = name[2:]
                    tenants[tenant] = tenants.get(tenant, 0) + int(value)
        return Backlog(waiting, starting, queued, dict(sorted(tenants.items())))

    async def tenants(self) -> dict[str, int]:
        """New sessions waiting to start (queued or starting), per tenant, over every shard:
        :meth:`backlog`'s ``tenants`` from the shards' ``adm`` hashes alone (the relay's
        ACL reads those and the queues, for the ``baton.backlog`` gauge)."""
        try:
            async with self.redis.pipeline(transaction=False) as p:
                for shard in range(self.keys.shards):
                    p.hgetall(self.keys.admission(shard)[0])
                replies = await p.execute()
        except REDIS_ERRORS as exc:
            raise from_redis_error(exc, role="relay", namespace=self.keys.ns) from exc
        tenants: dict[str, int] = {}
        for state in replies:
            for name, value in (state or {}).items():
                name = name.decode() if isinstance(name, bytes) else str(name)
                if name.startswith("n:") and int(value) > 0:
                    tenants[name[2:]] = tenants.get(name[2:], 0) + int(value)
        return dict(sorted(tenants.items()))


class AdmissionGate:
    """A client's check of the bounds on waiting work before it writes a new session."""

    def __init__(self, queue: AdmissionQueue, settings: Settings) -> None:
        self.queue, self.settings = queue, settings
        self._seen: Backlog | None = None
        self._seen_at = 0.0
        self._lock = asyncio.Lock()

    @property
    def bounded(self) -> bool:
        s = self.settings
        return s.admission_window > 0 and (s.max_waiting > 0 or s.max_waiting_per_tenant > 0)

    async def check(self, tenant: str) -> None:
        """BacklogFullError when ``tenant`` or all tenants are at their bound; else counts
        the submission about to be written against the counts seen."""
        if not self.bounded:
            return
        s = self.settings
        async with self._lock:
            if self._seen is None or time.monotonic() - self._seen_at > GATE_REFRESH_S:
                self._seen, self._seen_at = await self.queue.backlog(), time.monotonic()
            seen = self._seen
            mine = seen.tenants.get(tenant, 0)
            if s.max_waiting_per_tenant and mine >= s.max_waiting_per_tenant:
                raise BacklogFullError(tenant, "tenant", mine, s.max_waiting_per_tenant,
                                       s.admission_retry_after_s)
            if s.max_waiting and seen.waiting >= s.max_waiting:
                raise BacklogFullError(tenant, "total", seen.waiting, s.max_waiting,
                                       s.admission_retry_after_s)
            self._seen = Backlog(seen.waiting + 1, seen.starting, seen.queued,
                                 {**seen.tenants, tenant: mine + 1})

    def forget(self) -> None:
        """Read the counts again at the next check (a submission was not new after all)."""
        self._seen = None
