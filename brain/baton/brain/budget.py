"""A Brain's side of the models' fleet-wide budgets: each call of a budgeted model waits for
its slot and its admissions, and gives back what it did not use.

:class:`ModelGate` holds the budgets this Brain knows (``BATON_MODEL_BUDGETS`` over the
App's ``model_budgets``, see :mod:`baton.budgets`). A model without one is called as it is:
no Redis call, nothing per step. Around a budgeted call (:meth:`ModelGate.admitted`):

- **before**: the call's tokens are estimated (its prompt at four characters a token, plus
  the most output it may ask for, ``model_max_tokens``: what the providers count against a
  tokens-per-minute limit as the call starts), and the call waits in the budget's line in
  Redis (:mod:`baton.store.budgets`) until it has a slot and both rates' admissions. It
  waits for what the answer says (a slot's expiry, a rate's next admission, a pause's end)
  or for another Brain's message that a slot was freed (NATS, ``BusNames.budget_subject``):
  never a poll. The wait is a log line (``model_call_waiting``, then ``model_call_admitted``)
  and a span (``wait for <model> budget``).
- **during**: the slot is renewed every third of its time (``lease_ms``), so a Brain that
  dies loses it after one slot time, and no slot is lost for good.
- **after**: the slot is released with the usage's correction (what the provider reported
  against the estimate: given back or charged); a 429 with ``Retry-After`` pauses the budget
  for the whole fleet for that long (the later of the pauses asked, never their sum) and
  gives the estimate back (the provider counted nothing). The failed call itself is retried
  by its task as any retryable failure (a durable sleep of ``Retry-After``, brain.retry);
  every other call of the model, in every Brain, waits out the pause in its line instead of
  meeting a 429 of its own: no storm of retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import nats.errors
import orjson

from baton.brain.model import ModelRequest
from baton.budgets import ModelBudget, budget_key
from baton.bus.bus import Bus
from baton.errors import BatonError, ModelRetryableError
from baton.models import Usage
from baton.observability.log import bounded, get_logger
from baton.observability.tracing import waiting_for_budget
from baton.store.admission import weight_in
from baton.store.budgets import Budgets

__all__ = ["Charge", "ModelGate", "estimate_tokens"]

log = get_logger("baton.brain")

#: Characters a token stands for in the estimate (the providers' rule of thumb for English).
CHARS_PER_TOKEN = 4
#: Characters counted per message beside its text (role, separators).
MESSAGE_OVERHEAD = 16


def estimate_tokens(request: ModelRequest, max_output: int) -> int:
    """A call's tokens before it is made: its prompt's characters / 4, and its most output."""
    chars = len(request.instructions) + sum(len(orjson.dumps(t)) for t in request.tools)
    for e in request.entries:
        chars += len(e.text) + MESSAGE_OVERHEAD
        chars += sum(len(c.name) + len(orjson.dumps(c.arguments)) for c in e.tool_calls)
    return math.ceil(chars / CHARS_PER_TOKEN) + max_output


@dataclass
class Charge:
    """What a budgeted call reports back to its gate: the usage the provider counted."""

    estimate: int
    usage: Usage | None = None

    def used(self, usage: Usage) -> None:
        """The provider's count (no count, zero tokens: the estimate stands)."""
        if usage.input_tokens or usage.output_tokens:
            self.usage = usage

    @property
    def correction(self) -> int:
        if self.usage is None:
            return 0
        return self.usage.input_tokens + self.usage.output_tokens - self.estimate


class ModelGate:
    """The model budgets of one Brain, on its Redis store and NATS connection."""

    def __init__(self, budgets: Mapping[str, ModelBudget], store: Budgets, bus: Bus | None,
                 *, worker: str, max_output: int, weights: str = "") -> None:
        self.budgets = dict(budgets)
        self.weights = weights  # the tenants' shares ("acme=3,globex=1", tenant_weights)
        self.store, self.bus, self.worker = store, bus, worker
        self.max_output = max_output
        #: Per budget: set (and replaced) when a Brain announces a slot freed.
        self._freed: dict[str, asyncio.Event] = {}

    def budget_of(self, model: str) -> tuple[str, ModelBudget] | None:
        """The budget of the model agents name ``model``, with its key; None: none."""
        key = budget_key(model)
        budget = self.budgets.get(key)
        return (key, budget) if budget is not None else None

    async def listen(self) -> None:
        """Hear the other Brains announce a budget's slot freed (nats-py subscribes again
        after a reconnect; a message lost meanwhile costs a wait up to the slot's expiry)."""
        if self.bus is None:
            return
        for key in self.budgets:
            self._freed[key] = asyncio.Event()

            async def freed(_msg: object, key: str = key) -> None:
                event, self._freed[key] = self._freed[key], asyncio.Event()
                event.set()

            await self.bus.nc.subscribe(self.bus.names.budget_subject(key), cb=freed)

    @contextlib.asynccontextmanager
    async def admitted(self, model: str, request: ModelRequest, *, tenant: str = ""
                       ) -> AsyncIterator[Charge | None]:
        """Around one call of ``model``: yields None when it has no budget (nothing done),
        else a :class:`Charge` once the call may go (see the module). Calls waiting in line
        are served in arrival order within their session's ``tenant``, tenants taking turns
        by weight (baton.store.admission)."""
        found = self.budget_of(model)
        if found is None:
            yield None
            return
        key, budget = found
        store = self.store
        charge = Charge(estimate_tokens(request, self.max_output) if budget.tpm else 0)
        # One member per call: a request's attempts each wait and count on their own.
        # <call>/<brain>/<nonce>/<tenant>: inspect counts slots and places by tenant
        member = (f"{request.request_id}/{self.worker}/{uuid.uuid4().hex[:8]}/"
                  f"{tenant or 'default'}")
        renewing: asyncio.Task[None] | None = None
        pause_ms = 0
        try:
            share = (tenant, weight_in(self.weights, tenant or "default"))
            await self._wait(key, budget, member, charge.estimate, request, share)
            if budget.concurrency:
                renewing = asyncio.create_task(self._renew(key, budget, member),
                                               name=f"budget:{key}")
            try:
                yield charge
            except ModelRetryableError as exc:
                if exc.status == 429 and exc.retry_after_s:
                    pause_ms = math.ceil(exc.retry_after_s * 1000)
                    charge.usage = Usage()  # nothing counted: the estimate is given back
                    log.warning("model_budget_paused", model=key, pause_ms=pause_ms,
                                request_id=request.request_id,
                                note="every Brain's calls of this model wait it out")
                elif isinstance(usage := getattr(exc, "usage", None), Usage):
                    charge.used(usage)  # a truncated stream's count so far
                raise
        finally:
            if renewing is not None:
                renewing.cancel()
            try:  # a slot left behind comes back at its expiry; a place, when it reaches the head
                released = await store.release(key, budget, member,
                                               correction=charge.correction, pause_ms=pause_ms)
                if released.announce and self.bus is not None:
                    await self.bus.nc.publish(self.bus.names.budget_subject(key), b"")
            except (BatonError, nats.errors.Error) as exc:
                log.warning("model_budget_release_failed", model=key, error=bounded(exc))

    async def _wait(self, key: str, budget: ModelBudget, member: str, tokens: int,
                    request: ModelRequest, share: tuple[str, int]) -> None:
        """Until the call has its slot and admissions (in the budget's line in Redis)."""
        store = self.store
        tenant, weight = share
        grant = await store.acquire(key, budget, member, tokens, tenant=tenant, weight=weight)
        if grant.granted:
            return
        since = time.monotonic()
        log.info("model_call_waiting", model=key, budget=budget.describe(),
                 request_id=request.request_id, waiting_for=grant.waiting_for,
                 position=grant.position, retry_in_ms=grant.retry_ms, tokens=tokens)
        async with waiting_for_budget(key) as place:
            while not grant.granted:
                place(grant.position, grant.waiting_for)
                freed = self._freed.get(key) or asyncio.Event()
                # at least every half slot time: a waiter that stops asking loses its place
                wait_s = min(grant.retry_ms, store.slot_ms // 2) / 1000
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(freed.wait(), max(wait_s, 0.001))
                grant = await store.acquire(key, budget, member, tokens, tenant=tenant,
                                            weight=weight)
        log.info("model_call_admitted", model=key, request_id=request.request_id,
                 waited_ms=round((time.monotonic() - since) * 1000))

    async def _renew(self, key: str, budget: ModelBudget, member: str) -> None:
        """Renew a held slot every third of its time while the call runs."""
        while True:
            await asyncio.sleep(self.store.slot_ms / 3000)
            try:
                if not await self.store.renew(key, budget, member):
                    log.warning("model_budget_slot_lost", model=key,
                                note="its time passed unrenewed (this Brain's event loop or "
                                     "Redis stalled): the call goes on, no longer counted")
                    return
            except BatonError as exc:  # Redis away: the next tick tries again
                log.warning("model_budget_renew_failed", model=key, error=bounded(exc))
