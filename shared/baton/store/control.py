"""Operator decisions on running work: cancel a session or task, approve or reject a tool run.

:class:`Decisions` is the collaborator a :class:`~baton.store.store.Store` holds as
``store.decisions``. Each decision is one idempotent script (``cancel.lua``,
``approve.lua``) that records it as a request in the session's inbox, with a wake and a
receipt naming who decided, before anything acts on it. The Brain carries it out in its
own commit (brain.cancel, brain.decisions). These never take a lease and write nothing a
Brain owns.
"""

from __future__ import annotations

import datetime
import hashlib
import re
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from baton.bus.subjects import BusNames
from baton.errors import ConflictError, not_found
from baton.models import ToolIntent, ToolResult, WorkerRef, dumps
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


#: The longest cancel reason a task keeps (characters).
MAX_CANCEL_REASON = 500

_AT_MS = re.compile(r"\(at (\d{10,}) ms")


def _utc(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(
        timespec="seconds").replace("+00:00", "Z")


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
        args = [session_id, target, wake, worker.model_dump_json(), receipt]
        if reason:  # the cancelled tasks end with it (bounded, as any text a task keeps)
            args.append(reason[:MAX_CANCEL_REASON])
        reply = await self.scripts.run("cancel", sk, args)
        status = reply[0]
        return CancelAnswer(status, session_id, target, str(reply[2]) if len(reply) > 2 else "")

    async def approve(self, names: BusNames, session_id: str, run_id: str, digest: str,
                      worker: WorkerRef) -> int:
        """Approve a run awaiting approval: the Brain dispatches it once, in its next commit.
        Returns the session's commit sequence when the approval was recorded. ``names``
        is kept for callers; the Brain builds the dispatch on its own subjects.

        ``ConflictError`` when the digest is not that of the run's arguments (nothing is
        dispatched) or the run awaits no approval any more (approved before, rejected, ended).
        """
        intent = await self._awaiting(session_id, run_id)
        receipt = dumps({"detail": {"run_id": run_id, "tool": intent.tool, "digest": digest,
                                    "decision": "approve"}})
        wake = dumps({"v": 1, "session_id": session_id, "reason": f"approve:{run_id}"})
        try:
            _, seq = await self.scripts.run(
                "approve", self.keys.session(session_id),
                [session_id, run_id, "approve", digest, worker.model_dump_json(), receipt, "",
                 wake], run_id)
        except ConflictError as exc:  # "(at <ms> ms": the time as a person reads it
            text = _AT_MS.sub(lambda m: f"(at {_utc(int(m[1]))}", exc.message)
            if text == exc.message:
                raise
            raise ConflictError(text, **exc.fields) from None
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
