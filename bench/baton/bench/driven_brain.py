"""The driven Brain of ``baton bench e2e``: this process plays the Brain for sessions of a
second agent (``rtt``, with a wake consumer of its own that no Brain of the stack reads),
with Baton's own code (``Generation`` phases, ``Store``, ``Bus``, ``Holds``), and
times one tool round trip per session: from the start of the commit of the tool intent to
the return of the state the Brain looks at with the result, while the stack's relay and
Hands serve it. Two ways, as a Brain takes them:

* **held** (as shipped, ``BATON_BRAIN_HOLD_MS`` > 0): the intent commit keeps the lease,
  the completion's signal comes on this process' hold channel, and the release that finds
  the result returns the state in the same round trip (:mod:`baton.brain.held`);
* **released** (holds off): the intent commit releases the lease, the completion writes a
  wake row that the relay publishes, and the wake's fetch is followed by a lease and its
  reads in one round trip (``acquire_and_load``).

It uses a store of its own as a Brain's, which keeps the entries of the sessions it leased
(:mod:`baton.store.entry_cache`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from baton.app import Agent, App
from baton.brain.context import TaskContext
from baton.brain.generation import Generation
from baton.brain.held import Holds
from baton.brain.model import ModelResponse
from baton.brain.requests import consume_requests
from baton.bus.bus import Bus, Puller
from baton.client import Client
from baton.faults import Faults
from baton.hands.tools import send_email
from baton.models import Task, ToolCall
from baton.store.entry_cache import EntryCache
from baton.store.store import HoldEnd, Store, worker_ref

__all__ = ["ONE", "RTT_AGENT", "DrivenBrain"]

ONE = "Send the approved notice to ada@example.com, then summarise."
RTT_AGENT = "rtt"  # the driven sessions' agent: no Brain of the stack consumes its wakes


class DrivenBrain:
    """Plays the Brain for ``rtt`` sessions with Baton's own phases, timing the round trip."""

    def __init__(self, client: Client, store: Store, bus: Bus, puller: Puller,
                 holds: Holds | None = None) -> None:
        self.client = client
        self.store = store
        self.settings = client.settings
        self.bus = bus
        self.puller = puller
        self.worker = worker_ref("brain", "bench-driven-brain")
        self.gen = Generation()
        self.app = App(agents=[Agent(name=RTT_AGENT, compat=1, model="scripted",
                                     tools=("send_email",), instructions="bench")],
                       tools=[send_email])
        self.faults = Faults("")
        self.holds = holds
        self._listener: asyncio.Task[None] | None = None
        self.samples: list[dict[str, float]] = []
        self.early = 0
        self.unheld = 0  # held round trips whose commit did not hold (then released)
        # This process is the Brain of the rtt agent, which no live Brain announces: the
        # client's warning that its input waits for one would be wrong (once per submit).
        self._warned = client.warn_unserved
        client.warn_unserved = False

    @classmethod
    async def open(cls, client: Client) -> DrivenBrain:
        """A driven Brain; it can hold (its hold channels subscribed) when the settings'
        ``brain_hold_ms`` is above zero, as a Brain of the stack does."""
        bus = await Bus.connect(client.settings, "bench-driven-brain")
        names = bus.names
        durable = names.wake_durable(RTT_AGENT, 1)
        await bus.ensure_consumer(names.wake_stream, durable, names.wake_subject(RTT_AGENT, 1))
        s = client.settings
        # A store as a Brain's: it keeps the entries of the sessions it leased
        store = await Store.connect(s, entry_cache=EntryCache(s.entry_cache_bytes)
                                    if s.entry_cache_bytes else None)
        holds = None
        if s.brain_hold_ms > 0:
            holds = Holds(store.redis, store.keys, "bench-driven-brain",
                                s.shards, hold_ms=s.brain_hold_ms, limit=1,
                                stopping=asyncio.Event())
        driven = cls(client, store, bus, await bus.pull(names.wake_stream, durable), holds)
        if holds is not None:
            driven._listener = asyncio.ensure_future(holds.run())
            async with asyncio.timeout(10):
                await holds.tried.wait()
            if not holds.listening:
                await driven.close()
                raise RuntimeError("the driven Brain could not subscribe its hold channels")
        return driven

    @property
    def can_hold(self) -> bool:
        return self.holds is not None

    async def close(self) -> None:
        self.client.warn_unserved = self._warned
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
        await self.puller.close()
        await self.bus.close()
        await self.store.close()

    async def _wake(self, session_id: str) -> None:
        """Fetch as the Brain does (up to 64, 0.5 s long poll) until this session's wake."""
        async with asyncio.timeout(10):
            while True:
                for msg in await self.puller.fetch(64, timeout=0.5):
                    await msg.ack()
                    if session_id.encode() in msg.data:
                        return

    async def _woken(self, sid: str) -> tuple[Any, int, float]:
        """Wait for the session's wake, then lease it and read its state in one round trip:
        the state, the fence and when the wake came (perf_counter)."""
        await self._wake(sid)
        t_wake = time.perf_counter()
        lease, state = await self.store.acquire_and_load(sid, self.worker,
                                                         self.settings.lease_ms)
        return state, lease.fence, t_wake

    def _ctx(self, sid: str, fence: int, state: Any, *, hold: bool) -> TaskContext:
        """A pass's context; ``hold``: its last commit may hold the lease for tool results."""
        return TaskContext(session_id=sid, fence=fence, state=state, store=self.store,
                           settings=self.settings, app=self.app, names=self.bus.names,
                           worker=self.worker, faults=self.faults,
                           holds=self.holds if hold else None)

    async def _released(self, ctx: TaskContext) -> tuple[Any, int, float]:
        """After the intent commit released the lease: wait for the relay's wake, lease and
        load. The state, the new fence and when the wake came (perf_counter)."""
        sid = ctx.session_id
        if ctx.recheck:  # work came before the commit (its nudge): release it anyway
            self.early += 1
            while await self.store.release(sid, ctx.fence, self.settings.lease_ms):
                pass
        return await self._woken(sid)

    async def _recheck_after_hold(self, ctx: TaskContext) -> tuple[Any, int, float]:
        """After a commit that kept the lease for the result: wait for its signal, then the
        release that finds it and reads the state in its round trip (as a Brain's pass)."""
        assert self.holds is not None
        sid = ctx.session_id
        since = time.monotonic()
        headers = await self.holds.hold(sid)
        t_word = time.perf_counter()
        end = HoldEnd(self.worker, heard=headers is not None,
                      hold_ms=round((time.monotonic() - since) * 1000))
        state = await self.store.release_and_load(sid, ctx.fence, self.settings.lease_ms,
                                                  hold_end=end)
        if state is None:  # the hold ran out before the result: the wake row brings it
            return await self._woken(sid)
        return state, ctx.fence, t_word

    async def once(self, i: int, *, hold: bool = False) -> None:
        """One round trip; ``hold``: the held way (needs :attr:`can_hold`), else released."""
        sub, _ = await self.client.submit(ONE, agent=RTT_AGENT)
        sid = sub.session_id
        state, fence, _ = await self._woken(sid)
        ctx = self._ctx(sid, fence, state, hold=hold)
        await consume_requests(ctx)  # open the session from its submit request, as a Brain does
        task: Task = next(iter(ctx.state.tasks.values()))
        if task.state.name == "pending":  # else started by the commit that took it up
            task = await self.gen._prepare(task, ctx)
        call = ToolCall(id="call_0", name="send_email",
                        arguments={"to": "ada@example.com", "subject": "Notice", "body": ONE})
        response = ModelResponse(tool_calls=(call,), stop_reason="tool_use")
        # The intent commit is the pass's last, as a Brain's scheduler makes it: it releases
        # the lease, or keeps it for the result (held).
        ctx.idle_after = lambda _writes: True
        t0 = time.perf_counter()
        wall0 = time.time() * 1000
        await self.gen._dispatch(task, ctx, response, turn=1)  # the intent commit
        t_commit = time.perf_counter()
        if ctx.holding:
            state, fence, t_wake = await self._recheck_after_hold(ctx)
        else:
            if hold:
                self.unheld += 1
            state, fence, t_wake = await self._released(ctx)
        t1 = time.perf_counter()
        (run,) = state.runs.values()
        assert run.result is not None and run.result.ok, run
        receipts = {r.kind: r.ts_ms for r in await self.store.receipts(sid)}
        self.samples.append({
            "held": float(hold),
            "total_us": (t1 - t0) * 1e6,
            "tool_us": run.result.duration_ms * 1000,
            "commit_us": (t_commit - t0) * 1e6,
            "acquire_load_us": (t1 - t_wake) * 1e6,  # held: the release and its reads
            # Redis TIME (ms) against this process's wall clock: means only.
            "to_claim_ms": receipts["claim"] - wall0,
            "to_complete_ms": receipts["complete"] - wall0,
        })
        # Apply the result and finish (untimed): the session settles, its deadline is cleared.
        ctx = self._ctx(sid, fence, state, hold=False)
        applied = await self.gen._apply(next(iter(state.tasks.values())), ctx)
        if applied is not None:
            await self.gen._request(applied, ctx)
        await self.store.release(sid, fence, self.settings.lease_ms)
