"""A Brain's write-set: everything one commit changes, applied all-or-nothing by commit.lua."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from baton.models import (
    Entry,
    MarkRef,
    OutboxRow,
    Submission,
    Task,
    ToolIntent,
    dumps,
)
from baton.store.documents import DocumentChange


@dataclass
class Writes:
    """Collects the changes of one commit. Build it, then pass it to ``Store.commit``."""

    kind: str = "commit"
    entries: list[Entry] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)
    documents: list[DocumentChange] = field(default_factory=list)
    submissions: list[Submission] = field(default_factory=list)
    runs: list[ToolIntent] = field(default_factory=list)
    groups: dict[str, int] = field(default_factory=dict)
    applied: list[str] = field(default_factory=list)
    outbox: list[OutboxRow] = field(default_factory=list)
    timers_add: dict[str, int] = field(default_factory=dict)
    timers_remove: list[str] = field(default_factory=list)
    deadline_ms: int = 0  # > 0 arm, < 0 clear, 0 leave as is
    # With deadline_ms < 0 (nothing live after this commit): the session may be archived
    # this many ms from now, on Redis' clock (commit.lua 'rt'); 0: not armed.
    retain_ms: int = 0
    wake_subject: str = ""  # set to move the session to another compat level
    compat: int = 0  # with wake_subject: the session's new compat level
    # New runs that wait for an approval, by run id -> the arguments digest to present.
    awaiting: dict[str, str] = field(default_factory=dict)
    # Runs to stop: completed as cancelled at once if never claimed, else told by heartbeat.
    cancel_runs: list[str] = field(default_factory=list)
    cancel_result: str = ""  # the ToolResult JSON of a run cancelled before any claim
    # A person's decisions carried out: approved run id -> approval ms, rejected run id ->
    # the result it ends with (their inbox requests go in meta_del as "decide:<run id>").
    approve_runs: dict[str, int] = field(default_factory=dict)
    reject_runs: dict[str, str] = field(default_factory=dict)
    # Request ids taken up from the inbox: request id -> submission id, or
    # "task:<request id>" -> task id (their inbox requests go in meta_del).
    reqs: dict[str, str] = field(default_factory=dict)
    meta_set: dict[str, str] = field(default_factory=dict)  # "cancel:*" / "blocked:*" only
    meta_del: list[str] = field(default_factory=list)
    notify: list[tuple[str, str]] = field(default_factory=list)  # (channel, message)
    detail: dict[str, Any] = field(default_factory=dict)
    trace: dict[str, str] = field(default_factory=dict)
    # Terminal child tasks that stay in the live set until their parent has read them.
    keep_live: set[str] = field(default_factory=set)
    # > 0: the holder's last commit of its pass releases the lease after the writes (kept
    # and extended by this many ms when work arrived meanwhile; Store.commit_and_release).
    release_ttl_ms: int = 0
    # With release_ttl_ms: when no work arrived, hold the lease instead of releasing it,
    # listening as this name for the results of the runs in flight (commit.lua 'hd',
    # brain.held).
    hold_as: str = ""

    def __bool__(self) -> bool:
        return bool(
            self.entries or self.tasks or self.documents or self.submissions or self.runs
            or self.applied or self.outbox or self.timers_add or self.timers_remove
            or self.deadline_ms or self.wake_subject or self.cancel_runs or self.meta_set
            or self.meta_del or self.approve_runs or self.reject_runs
        )

    def moves_to_done(self, task: Task) -> bool:
        return task.terminal and task.id not in self.keep_live

    def marks(self) -> list[MarkRef]:
        return [MarkRef(run_id=r, mark="applied") for r in self.applied]

    def changes(self) -> dict[str, int]:
        counts = {
            "entries": len(self.entries),
            "tasks": len(self.tasks),
            "documents": len(self.documents),
            "submissions": len(self.submissions),
            "runs": len(self.runs),
            "applied": len(self.applied),
            "outbox": len(self.outbox),
            "timers": len(self.timers_add) + len(self.timers_remove),
            "cancelled_runs": len(self.cancel_runs),
        }
        return {k: v for k, v in counts.items() if v}

    def to_script(self) -> list[str]:
        """The arguments commit.lua reads after the fence, worker and session (its header)."""
        receipt = {
            "kind": self.kind,
            "marks": [{"run_id": r, "mark": "applied", "attempt": 0} for r in self.applied],
            "changes": self.changes(),
            "detail": self.detail,
            "trace": self.trace,
        }
        index: dict[str, Any] = {
            "ne": len(self.entries),
            "nt": len(self.tasks),
            "nd": len(self.documents),
            "ns": len(self.submissions),
            "nr": len(self.runs),
            "no": len(self.outbox),
            "g": [[g, n] for g, n in self.groups.items()],
            "a": list(self.applied),
            "ta": [[m, due] for m, due in self.timers_add.items()],
            "tr": list(self.timers_remove),
            "dl": self.deadline_ms,
            "w": self.wake_subject,
            "n": [list(n) for n in self.notify],
        }
        if self.retain_ms > 0:
            index["rt"] = self.retain_ms
        if self.compat:
            index["c"] = self.compat
        if self.awaiting:
            index["aw"] = [[r, d] for r, d in self.awaiting.items()]
        if self.cancel_runs:
            index["cr"] = list(self.cancel_runs)
            index["crr"] = self.cancel_result
        if self.approve_runs:
            index["ap"] = [[r, ms] for r, ms in self.approve_runs.items()]
        if self.reject_runs:
            index["rj"] = [[r, result] for r, result in self.reject_runs.items()]
        if self.meta_set:
            index["ms"] = [[k, v] for k, v in self.meta_set.items()]
        if self.reqs:
            index["rq"] = [[k, v] for k, v in self.reqs.items()]
        if self.meta_del:
            index["md"] = list(self.meta_del)
        if self.release_ttl_ms > 0:
            index["rl"] = self.release_ttl_ms
            if self.hold_as:
                index["hd"] = self.hold_as
        args = [dumps(index), dumps(receipt)]
        args.extend(e.to_json() for e in self.entries)
        for t in self.tasks:
            args += (t.id, t.to_json(), "1" if self.moves_to_done(t) else "0")
        for d in self.documents:
            args += (d.name, d.mode, str(d.document.version), d.payload)
        for s in self.submissions:
            args += (s.id, s.to_json(), "1" if s.settled else "0")
        for r in self.runs:
            args += (r.run_id, r.to_json())
        for o in self.outbox:
            args += (o.subject, o.data, dumps(o.headers))
        return args


def timer_member(kind: str, session_id: str, ident: str, wake_subject: str) -> str:
    """A timer's member in its shard's timer set (see fire_timers.lua)."""
    return f"{kind}|{session_id}|{ident}|{wake_subject}"
