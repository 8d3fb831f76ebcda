"""The driven Brain of ``baton bench e2e``: this process plays the Brain for sessions of a
second agent (``rtt``, with a wake consumer of its own that no Brain of the stack reads),
with Baton's own code (``Generation`` phases, ``Store``, ``Bus``), and times one tool round
trip per session: from the start of the commit of the tool intent to the return of the load
after the wake, while the stack's relay and Hands serve it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from baton.app import Agent, App
from baton.brain.context import TaskContext
from baton.brain.generation import Generation
from baton.brain.model import ModelResponse
from baton.brain.requests import consume_requests
from baton.bus.bus import Bus, Puller
from baton.client import Client
from baton.faults import Faults
from baton.hands.tools import send_email
from baton.models import Task, ToolCall
from baton.store.store import worker_ref

__all__ = ["ONE", "RTT_AGENT", "DrivenBrain"]

ONE = "Send the approved notice to ada@example.com, then summarise."
RTT_AGENT = "rtt"  # the driven sessions' agent: no Brain of the stack consumes its wakes


class DrivenBrain:
    """Plays the Brain for ``rtt`` sessions with Baton's own phases, timing the round trip."""

    def __init__(self, client: Client, bus: Bus, puller: Puller) -> None:
        self.client = client
        self.store = client.store
        self.settings = client.settings
        self.bus = bus
        self.puller = puller
        self.worker = worker_ref("brain", "bench-driven-brain")
        self.gen = Generation()
        self.app = App(agents=[Agent(name=RTT_AGENT, compat=1, model="scripted",
                                     tools=("send_email",), instructions="bench")],
                       tools=[send_email])
        self.faults = Faults("")
        self.samples: list[dict[str, float]] = []
        self.early = 0

    @classmethod
    async def open(cls, client: Client) -> DrivenBrain:
        bus = await Bus.connect(client.settings, "bench-driven-brain")
        names = bus.names
        durable = names.wake_durable(RTT_AGENT, 1)
        await bus.ensure_consumer(names.wake_stream, durable, names.wake_subject(RTT_AGENT, 1))
        return cls(client, bus, await bus.pull(names.wake_stream, durable))

    async def close(self) -> None:
        await self.puller.close()
        await self.bus.close()

    async def _wake(self, session_id: str) -> None:
        """Fetch as the Brain does (up to 64, 0.5 s long poll) until this session's wake."""
        async with asyncio.timeout(10):
            while True:
                for msg in await self.puller.fetch(64, timeout=0.5):
                    await msg.ack()
                    if session_id.encode() in msg.data:
                        return

    async def _context(self, sid: str) -> TaskContext:
        lease = await self.store.acquire(sid, self.worker, self.settings.lease_ms)
        state = await self.store.load(sid)
        return self._ctx(sid, lease.fence, state)

    def _ctx(self, sid: str, fence: int, state: Any) -> TaskContext:
        return TaskContext(session_id=sid, fence=fence, state=state, store=self.store,
                           settings=self.settings, app=self.app, names=self.bus.names,
                           worker=self.worker, faults=self.faults)

    async def once(self, i: int) -> None:
        sub, _ = await self.client.submit(ONE, agent=RTT_AGENT)
        sid = sub.session_id
        await self._wake(sid)
        ctx = await self._context(sid)
        await consume_requests(ctx)  # open the session from its submit request, as a Brain does
        task: Task = next(iter(ctx.state.tasks.values()))
        if task.state.name == "pending":  # else started by the commit that took it up
            task = await self.gen._prepare(task, ctx)
        call = ToolCall(id="call_0", name="send_email",
                        arguments={"to": "ada@example.com", "subject": "Notice", "body": ONE})
        response = ModelResponse(tool_calls=(call,), stop_reason="tool_use")
        t0 = time.perf_counter()
        wall0 = time.time() * 1000
        await self.gen._dispatch(task, ctx, response, turn=1)  # the intent commit
        t_commit = time.perf_counter()
        if await self.store.release(sid, ctx.fence, self.settings.lease_ms):
            self.early += 1  # the result was in before the release: the wake still comes
        await self._wake(sid)
        t_wake = time.perf_counter()
        lease = await self.store.acquire(sid, self.worker, self.settings.lease_ms)
        state = await self.store.load(sid)
        t1 = time.perf_counter()
        (run,) = state.runs.values()
        assert run.result is not None and run.result.ok, run
        receipts = {r.kind: r.ts_ms for r in await self.store.receipts(sid)}
        self.samples.append({
            "total_us": (t1 - t0) * 1e6,
            "tool_us": run.result.duration_ms * 1000,
            "commit_us": (t_commit - t0) * 1e6,
            "acquire_load_us": (t1 - t_wake) * 1e6,
            # Redis TIME (ms) against this process's wall clock: means only.
            "to_claim_ms": receipts["claim"] - wall0,
            "to_complete_ms": receipts["complete"] - wall0,
        })
        # Apply the result and finish (untimed): the session settles, its deadline is cleared.
        ctx = self._ctx(sid, lease.fence, state)
        applied = await self.gen._apply(next(iter(state.tasks.values())), ctx)
        if applied is not None:
            await self.gen._request(applied, ctx)
        await self.store.release(sid, lease.fence, self.settings.lease_ms)
