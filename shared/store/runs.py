"""The tool-run transitions of Hands: claim, heartbeat, complete, and run lookups.

:class:`RunTransitions` is a mixin that :class:`~baton.store.store.Store` composes; callers use
``Store``. Each transition is one fenced Lua script under the run's attempt (see claim.lua,
heartbeat.lua, complete.lua).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baton.models import ToolIntent, ToolResult, ToolRun, WorkerRef, decode, dumps
from baton.observability.tracing import counted_refusals, traced_claim, traced_complete
from baton.receipts import Carrier
from baton.store.keys import RUN_FIELDS
from baton.store.state import Claim, parse_runs

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from baton.settings import Settings
    from baton.store.keys import Keys, SessionKeys


class RunTransitions:
    """Hands-side transitions; relies on the ``Store`` it is mixed into."""

    if TYPE_CHECKING:
        redis: Redis
        settings: Settings
        keys: Keys

        async def _run(
            self, script: str, sk: SessionKeys, args: list[Any], run_id: str = ""
        ) -> Any: ...

        def _check_size(self, payload: str | list[str], what: str) -> None: ...

    @traced_claim
    async def claim(
        self, session_id: str, run_id: str, worker: WorkerRef, *, delivery: int = 1,
        carrier: Carrier | None = None,
    ) -> Claim:
        """Claim the next attempt; ``carrier`` (how the tool message came) goes in the receipt."""
        sk = self.keys.session(session_id)
        r = await self._run(
            "claim",
            sk,
            [run_id, worker.name, self.settings.attempt_ttl_ms, worker.model_dump_json(), delivery,
             carrier.model_dump_json() if carrier is not None else ""],
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
            args.append(worker.model_dump_json())
        reply = await self._run("heartbeat", self.keys.session(session_id), args, run_id)
        return reply == "cancelled"

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
        self._check_size(payload, "tool result")
        wake = dumps({"v": 1, "session_id": session_id, "reason": f"tool:{intent.run_id}"})
        receipt = dumps({
            "marks": [{"run_id": intent.run_id, "mark": "completed", "attempt": attempt}],
            "detail": {"run_id": intent.run_id, "tool": intent.tool, "outcome": result.outcome,
                       "recovery": result.recovery, "duration_ms": round(result.duration_ms, 1),
                       **(detail or {})},
            "trace": headers or {},
        })
        (woke,) = await self._run(
            "complete",
            sk,
            [intent.run_id, attempt, payload, worker.model_dump_json(), intent.group or "",
             "1" if force_wake or intent.wake_each else "0", wake, session_id, receipt,
             dumps(headers or {})],
            intent.run_id,
        )
        return bool(woke)

    async def run(self, session_id: str, run_id: str) -> ToolRun | None:
        """A tool run, live or applied, as a recovering worker or an operator sees it."""
        sk = self.keys.session(session_id)
        names = [f"{run_id}.{f}" for f in RUN_FIELDS]
        async with self.redis.pipeline(transaction=True) as p:
            p.hmget(sk.runs, names).hmget(sk.runs_done, names)
            live, done = await p.execute()
        for values in (live, done):
            if values[0] is not None:
                fields = {n: v for n, v in zip(names, values, strict=True) if v is not None}
                return parse_runs(fields)[run_id]
        return None

    async def applied_runs(self, session_id: str) -> dict[str, ToolRun]:
        return parse_runs(await self.redis.hgetall(self.keys.session(session_id).runs_done))


__all__ = ["RunTransitions"]
