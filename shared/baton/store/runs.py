"""The tool-run transitions of Hands: claim, heartbeat, complete, and run lookups; and the
note of a run's wait for a capped tool's slot (slot_wait).

:class:`Runs` is the collaborator a :class:`~baton.store.store.Store` holds as
``store.runs``: ``store.runs.claim(...)``. Each transition is one fenced Lua script under
the run's attempt (see claim.lua, heartbeat.lua, complete.lua), run through the store's
:class:`~baton.store.scripts.ScriptRunner`; those issued in the same event-loop turn (the
claims of one fetched batch, results that come in together) share one round trip
through the store's :class:`~baton.store.batch.ScriptBatch` (``Store.batch``).
"""

from __future__ import annotations

import functools
from typing import Any

from redis.asyncio import Redis

from baton.models import ToolIntent, ToolResult, ToolRun, WorkerRef, decode, dumps
from baton.observability.tracing import counted_refusals, traced_claim, traced_complete
from baton.receipts import Carrier
from baton.settings import Settings
from baton.store.batch import ScriptBatch
from baton.store.keys import RUN_FIELDS, Keys
from baton.store.scripts import ScriptRunner
from baton.store.state import BRAIN_RUN_FIELDS, Claim, parse_runs, with_intents


class Runs:
    """Hands-side transitions of tool runs, and reading a run as a worker or operator sees it."""

    def __init__(
        self, redis: Redis, keys: Keys, settings: Settings, scripts: ScriptRunner,
        batch: ScriptBatch,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.settings = settings
        self.scripts = scripts
        self.batch = batch  # the store's (Store.batch): its commits and leases share it

    @traced_claim
    async def claim(
        self, session_id: str, run_id: str, worker: WorkerRef, *, delivery: int = 1,
        carrier: Carrier | None = None, tool: str = "", gone_holder: str = "",
    ) -> Claim:
        """Take the next attempt of a run (mark "accepted"): its fence and saved intent, or
        why not (``busy``: a live attempt holds it; ``done``; ``gone``: no such run).
        ``carrier`` (how the tool message came) goes in the receipt. With ``tool`` (the tool
        the message names), a run committed for another tool raises
        :class:`~baton.errors.ToolMismatchError` and is left untouched. ``gone_holder``
        names a worker known disconnected: its live-looking attempt is taken over now."""
        sk = self.keys.session(session_id)
        # the claims of one session issued in the same loop turn (one fetched batch) go in
        # one claim.lua call, each run still claimed under its own attempt fence
        r = await self.batch.run_item(
            "claim", sk, [worker.name, self.settings.attempt_ttl_ms, worker_json(worker)],
            [run_id, delivery, carrier.model_dump_json() if carrier is not None else "", tool,
             gone_holder],
            run_id,
        )
        status = r[0]
        if status == "claimed":
            return Claim(
                "claimed",
                attempt=int(r[1]),
                previous_attempt=int(r[2]),
                previous_status=r[3] or "",
                intent=decode(ToolIntent, r[4]),
                previous_worker=r[5],
                cancelled=len(r) > 6 and int(r[6]) == 1,
            )
        if status == "busy":
            return Claim("busy", holder=r[1], remaining_ms=int(r[2]))
        if status == "done":
            return Claim("done", previous_status=r[1])
        return Claim("gone")

    @counted_refusals("heartbeat")
    async def heartbeat(
        self, session_id: str, run_id: str, attempt: int, worker: WorkerRef | None = None
    ) -> bool:
        """True when the run was asked to stop (cancelled); raises ``StaleAttemptError``
        once the attempt is no longer current."""
        args: list[Any] = [run_id, attempt]
        if worker is not None:
            args.append(worker_json(worker))
        reply = await self.batch.run("heartbeat", self.keys.session(session_id), args, run_id)
        return reply == "cancelled"

    async def slot_wait(
        self, session_id: str, run_id: str, tool: str, worker: WorkerRef, state: str, *,
        position: int = 0, waited_ms: int = 0,
    ) -> bool:
        """Note in the session's receipts that the run waits for a slot of its capped tool
        (``state`` "waiting", ``position`` its place in line, 0: waiting for the rate only),
        got one ("granted") or stopped waiting ("left"), after ``waited_ms`` (see
        slot_wait.lua); False when the run is no live run (nothing written)."""
        reply = await self.scripts.run(
            "slot_wait", self.keys.session(session_id),
            [run_id, tool, worker_json(worker), state, position, waited_ms], run_id)
        return bool(reply)

    @traced_complete
    async def complete(
        self,
        session_id: str,
        intent: ToolIntent,
        attempt: int,
        result: ToolResult,
        worker: WorkerRef,
        *,
        force_wake: bool = False,
        detail: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> bool:
        """Commit the result under the attempt fence; True when it woke the Brain."""
        sk = self.keys.session(session_id)
        payload = result.to_json()
        self.scripts.check_size(payload, "tool result")
        wake = dumps({"v": 1, "session_id": session_id, "reason": f"tool:{intent.run_id}"})
        receipt = dumps({
            "marks": [{"run_id": intent.run_id, "mark": "completed", "attempt": attempt}],
            "detail": {"run_id": intent.run_id, "tool": intent.tool, "outcome": result.outcome,
                       "recovery": result.recovery, "duration_ms": round(result.duration_ms, 1),
                       **(detail or {})},
            "trace": headers or {},
        })
        # the completions of one session issued in the same loop turn (results that came
        # back together) go in one complete.lua call, each run under its own attempt fence
        reply = await self.batch.run_item(
            "complete", sk, [worker_json(worker), session_id],
            [intent.run_id, attempt, payload, intent.group or "",
             "1" if force_wake or intent.wake_each else "0", wake, receipt,
             dumps(headers or {})],
            intent.run_id,
        )
        return bool(reply[0])

    async def get(self, session_id: str, run_id: str) -> ToolRun | None:
        """A tool run, live or applied, as a recovering worker or an operator sees it."""
        sk = self.keys.session(session_id)
        names = [f"{run_id}.{f}" for f in RUN_FIELDS]
        own = [run_id, *(f"{run_id}.{f}" for f in BRAIN_RUN_FIELDS)]
        async with self.redis.pipeline(transaction=True) as p:
            p.hmget(sk.runs, names)
            p.hmget(sk.runs_done, names)
            p.hmget(sk.intents, own)
            live, done, mine = await p.execute()
        if mine[0] is not None:  # live: the Hands' records and the Brain's, merged
            runs = {n: v for n, v in zip(names, live, strict=True) if v is not None}
            intents = {n: v for n, v in zip(own, mine, strict=True) if v is not None}
            return parse_runs(with_intents(runs, intents)).get(run_id)
        if done[0] is not None:
            fields = {n: v for n, v in zip(names, done, strict=True) if v is not None}
            return parse_runs(fields)[run_id]
        return None

    async def live(self, session_id: str) -> dict[str, ToolRun]:
        """The session's runs not applied yet (dispatched, running, awaiting approval...)."""
        sk = self.keys.session(session_id)
        async with self.redis.pipeline(transaction=True) as p:
            p.hgetall(sk.runs)
            p.hgetall(sk.intents)
            runs, intents = await p.execute()
        return parse_runs(with_intents(runs, intents))

    async def applied(self, session_id: str) -> dict[str, ToolRun]:
        """The session's runs whose result a Brain applied (moved out of the live runs)."""
        fields: dict[str, str] = await self.redis.hgetall(  # type: ignore[assignment]
            self.keys.session(session_id).runs_done)  # decode_responses: str, not bytes
        return parse_runs(fields)


__all__ = ["Runs", "worker_json"]


@functools.lru_cache(maxsize=256)
def worker_json(worker: WorkerRef) -> str:
    """The worker's JSON, serialised once per worker: it goes with every lease, commit and
    tool-run script call."""
    return worker.model_dump_json()
