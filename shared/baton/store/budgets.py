"""Fleet-wide budgets of models: concurrent calls, requests and tokens per minute, and the
provider's pauses, held in Redis for every Brain.

Each Brain runs up to ``brain_concurrency`` sessions; a provider's account allows far fewer
calls and tokens a minute for the whole fleet. A model's budget is declared once
(:class:`~baton.budgets.ModelBudget`) and every call of it, in whichever Brain, takes a slot
and its admissions at both rates from one place, ``model_limit.lua`` (keys:
:meth:`~baton.store.keys.Keys.model_budget`), with the algorithms of the tools' limits
(:mod:`baton.store.limits`):

- **slots**: at most ``concurrency`` calls hold one at a time, renewed while the call runs;
  a Brain that died stops renewing, and its slot is free once the slot time passed.
- **rates**: requests and tokens per minute by the generic cell rate algorithm, a call
  costing one request and its tokens: estimated before the call (its prompt and its most
  output), corrected once the provider reported its usage (:meth:`Budgets.release`: the
  difference given back or charged).
- **pauses**: a 429 with ``Retry-After`` pauses the budget for that long, once: the later of
  the pauses asked is kept, never their sum, and every Brain's next call waits it out.

Calls wait in arrival order, keeping their place by asking again when told (each answer
says when at the latest, and what it waits for); a release is announced to the waiting
Brains (the caller's business: :meth:`Budgets.release` says whether anyone may go now).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, cast

from redis.asyncio import Redis

from baton.budgets import ModelBudget
from baton.errors import from_redis_error
from baton.store.admission import LINE_COUNTED, by_tenant
from baton.store.keys import Keys
from baton.store.redis_client import REDIS_ERRORS
from baton.store.scripts import Scripts

__all__ = ["BudgetState", "Budgets", "Grant", "Released", "WaitingFor"]

#: What a call not admitted yet waits for.
WaitingFor = Literal["", "paused", "slot", "requests", "tokens"]


@dataclass(frozen=True, slots=True)
class Grant:
    """An answer to :meth:`Budgets.acquire`."""

    granted: bool
    #: 1-based place among the calls waiting; 0 when granted, or when first in line and
    #: waiting for a rate only.
    position: int = 0
    #: Ask again at the latest after this long (ms); a release announced earlier is reason
    #: to ask sooner.
    retry_ms: int = 0
    waiting_for: WaitingFor = ""


@dataclass(frozen=True, slots=True)
class Released:
    """An answer to :meth:`Budgets.release`."""

    #: Calls wait that may go now: announce it (never during a pause).
    announce: bool
    #: How long the budget stays paused (ms, 0: not paused).
    paused_ms: int


@dataclass(frozen=True, slots=True)
class BudgetState:
    """A model's budget now (:meth:`Budgets.look`)."""

    in_use: int
    waiting: int
    paused_ms: int
    #: The wait for the next call at each rate (ms; the tokens' for a call of one token).
    requests_wait_ms: int
    tokens_wait_ms: int
    #: Slots held and calls in line, by the tenant of their sessions.
    in_use_by_tenant: dict[str, int] = field(default_factory=dict)
    waiting_by_tenant: dict[str, int] = field(default_factory=dict)


class Budgets:
    """The fleet-wide budgets of models, on one Redis client. ``slot_ms``: how long a slot
    lasts unless renewed (its holder renews it well within while the call runs)."""

    def __init__(self, redis: Redis, keys: Keys, *, slot_ms: int) -> None:
        self.redis, self.keys, self.slot_ms = redis, keys, slot_ms
        self._script = Scripts(redis).model_limit

    async def _call(self, op: str, model: str, budget: ModelBudget, member: str,
                    tokens: int = 0, pause_ms: int = 0, tenant: str = "",
                    weight: int = 1) -> list[int | str]:
        try:
            reply = await self._script(
                keys=self.keys.model_budget(model),
                args=[op, member, budget.concurrency, self.slot_ms, budget.rpm, budget.tpm,
                      budget.burst_ms, tokens, pause_ms, tenant, weight])
        except REDIS_ERRORS as exc:
            raise from_redis_error(exc, role="brain", namespace=self.keys.ns) from exc
        return [v.decode() if isinstance(v, bytes) else v for v in reply]

    async def acquire(self, model: str, budget: ModelBudget, member: str,
                      tokens: int, *, tenant: str = "", weight: int = 1) -> Grant:
        """Take a slot and both rates' admissions for call ``member`` costing ``tokens``
        (its estimate), or its place in line: in arrival order within ``tenant``, tenants
        with calls waiting taking turns by ``weight`` (as tool_limit.lua's line)."""
        granted, position, retry, why = await self._call("acquire", model, budget, member,
                                                         tokens, 0, tenant, weight)
        return Grant(bool(granted), int(position), int(retry),
                     cast(WaitingFor, str(why or "")))

    async def renew(self, model: str, budget: ModelBudget, member: str) -> bool:
        """Extend ``member``'s slot; False when it holds none (it expired)."""
        return bool((await self._call("renew", model, budget, member))[0])

    async def release(self, model: str, budget: ModelBudget, member: str, *,
                      correction: int = 0, pause_ms: int = 0) -> Released:
        """Give up ``member``'s slot or place in line; charge ``correction`` tokens more
        (negative: give them back) and pause the budget ``pause_ms`` (the later pause
        kept), in one step."""
        _, announce, paused = await self._call("release", model, budget, member,
                                               correction, pause_ms)
        return Released(bool(announce), int(paused))

    async def look(self, model: str, budget: ModelBudget) -> BudgetState:
        """Slots in use, calls waiting, the pause left and the rates' waits (ms): read
        commands only (the operator, who runs no script, may look), all on one slot."""
        slots, waiting, _, _, rtat, ttat, paused = self.keys.model_budget(model)
        try:
            sec, usec = await self.redis.time()
            now = int(sec) * 1000 + int(usec) // 1000
            async with self.redis.pipeline(transaction=False) as p:
                p.zcount(slots, f"({now}", "+inf")
                p.zcard(waiting)
                for key in (rtat, ttat, paused):
                    p.get(key)
                p.zrangebyscore(slots, f"({now}", "+inf", start=0, num=LINE_COUNTED)
                p.zrange(waiting, 0, LINE_COUNTED - 1)
                used, queued, r, t, until, holders, line = await p.execute()
        except REDIS_ERRORS as exc:
            raise from_redis_error(exc, role="operator", namespace=self.keys.ns) from exc

        def wait(stored: object, per_minute: int) -> int:  # as model_limit.lua's rate_wait()
            if not per_minute:
                return 0
            step = 60000 / per_minute
            tat = max(float(stored or 0), now)  # type: ignore[arg-type]
            return max(round(tat + step - max(budget.burst_ms, step) - now), 0)

        return BudgetState(int(used), int(queued), max(int(float(until or 0)) - now, 0),
                           wait(r, budget.rpm), wait(t, budget.tpm), by_tenant(holders),
                           by_tenant(line))
