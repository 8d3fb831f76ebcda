"""Operator decisions on running work: cancel a session or task, approve or reject a tool run.

:class:`Decisions` is the collaborator a :class:`~baton.store.store.Store` holds as
``store.decisions``. Each decision is one idempotent script (``cancel.lua``,
``approve.lua``) that commits it before anything acts on it, with a receipt naming who
decided. The Brain carries a cancel out (brain.cancel); an approval dispatches its run in
the same step that records it. These never take a lease: they write only facts a Brain
reads on its next load.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from baton.bus.subjects import BusNames
from baton.errors import ConflictError, not_found
from baton.models import ToolDispatch, ToolIntent, ToolResult, WorkerRef, dumps
from baton.settings import Settings
from baton.store.keys import Keys
from baton.store.runs import Runs
from baton.store.scripts import ScriptRunner

__all__ = ["CancelAnswer", "Decisions", "args_digest"]


def args_digest(tool: str, arguments: dict[str, Any]) -> str:
    """The digest an approval presents: SHA-256 of the tool name and canonical arguments."""
    canonical = orjson.dumps({"tool": tool, "arguments": arguments},
                             option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


@dataclass(frozen=True)
class CancelAnswer:
    """What a cancel did: ``requested`` now, ``pending`` (asked before, being carried out) or
    ``finished`` (nothing left to cancel; ``outcome`` says how the target ended)."""

    status: Literal["requested", "pending", "finished"]
    session_id: str
    target: str  # a task id, or "*" for the whole session
    outcome: str = ""

    def to_dict(self) -> dict[str, str]:
        out = {"status": self.status, "session_id": self.session_id, "target": self.target}
        if self.outcome:
            out["outcome"] = self.outcome
        return out


class Decisions:
    """Cancel, approve and reject: what an operator (or a client) decides about running work."""

    def __init__(
        self, keys: Keys, settings: Settings, scripts: ScriptRunner, runs: Runs
    ) -> None:
        self.keys = keys
        self.settings = settings
        self.scripts = scripts
        self.runs = runs

    async def cancel(self, session_id: str, task_id: str | None, worker: WorkerRef,
                     reason: str = "") -> CancelAnswer:
        """Record the intent to cancel ``task_id`` (or every root task of the session)."""
        target = task_id or "*"
        sk = self.keys.session(session_id)
        wake = dumps({"v": 1, "session_id": session_id, "reason": "cancel"})
        receipt = dumps({"detail": {"target": target, "reason": reason or "cancelled"}})
        reply = await self.scripts.run("cancel", sk, [session_id, target, wake,
                                                      self.settings.progress_deadline_ms,
                                                      worker.model_dump_json(), receipt])
        status = reply[0]
        return CancelAnswer(status, session_id, target, str(reply[2]) if len(reply) > 2 else "")

    async def approve(self, names: BusNames, session_id: str, run_id: str, digest: str,
                      worker: WorkerRef) -> int:
        """Approve a run awaiting approval; dispatches it once. Returns the commit seq.

        ``ConflictError`` when the digest is not that of the run's arguments (nothing is
        dispatched) or the run awaits no approval any more (approved before, rejected, ended).
        """
        intent = await self._awaiting(session_id, run_id)
        msg = ToolDispatch(session_id=session_id, run_id=run_id, tool=intent.tool)
        receipt = dumps({"detail": {"run_id": run_id, "tool": intent.tool, "digest": digest,
                                    "decision": "approve"}})
        _, seq = await self.scripts.run(
            "approve", self.keys.session(session_id),
            [session_id, run_id, "approve", digest, worker.model_dump_json(), receipt,
             names.tool_subject(intent.tool), msg.to_json(), dumps(intent.trace)], run_id)
        return int(seq)

    async def reject(self, session_id: str, run_id: str, worker: WorkerRef,
                     reason: str = "") -> int:
        """Reject a run awaiting approval: it ends with an error the model (or task) sees."""
        intent = await self._awaiting(session_id, run_id)
        why = reason or "rejected by a person"
        result = ToolResult(outcome="error", error_code="rejected", error=why)
        wake = dumps({"v": 1, "session_id": session_id, "reason": f"reject:{run_id}"})
        receipt = dumps({"detail": {"run_id": run_id, "tool": intent.tool, "decision": "reject",
                                    "reason": why}})
        _, seq = await self.scripts.run(
            "approve", self.keys.session(session_id),
            [session_id, run_id, "reject", "", worker.model_dump_json(), receipt,
             result.to_json(), wake], run_id)
        return int(seq)

    async def _awaiting(self, session_id: str, run_id: str) -> ToolIntent:
        """The intent of a run that was saved as needing approval."""
        run = await self.runs.get(session_id, run_id)
        if run is None:
            raise not_found(f"run {run_id} in session {session_id}",
                            namespace=self.settings.namespace, session_id=session_id)
        if run.intent.approval_digest is None:
            raise ConflictError(f"run {run_id} ({run.intent.tool}) needs no approval",
                                session_id=session_id)
        return run.intent
