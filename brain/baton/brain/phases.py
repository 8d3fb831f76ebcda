"""What a custom task's phase sees and does: :class:`PhaseContext`.

A phase never writes to the store. Its context collects the changes (child tasks, tool runs
with their outbox rows, document versions) and the results it read; the handler commits them
together with the step the phase returned (see :mod:`baton.brain.custom`).
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from baton.brain.context import TaskContext
from baton.errors import ConfigError, ValidationError
from baton.models import (
    Checkpoint,
    Document,
    OutboxRow,
    Task,
    ToolDispatch,
    ToolIntent,
    ToolResult,
)
from baton.store.control import args_digest
from baton.store.documents import check_name, next_change
from baton.store.writes import Writes

if TYPE_CHECKING:
    from baton.brain.registry import Registry

__all__ = ["ChildResult", "PhaseContext", "child_id", "dispatch_row"]

PRIVATE = "_"  # checkpoint data keys starting with this belong to Baton, not to the phase


@dataclass(frozen=True)
class ChildResult:
    """A terminal child task as its parent sees it."""

    id: str
    kind: str
    outcome: str
    result: Any = None
    reason: str = ""
    input: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.outcome == "completed"


def child_id(kind: str, parent: str, step: int, index: int) -> str:
    """The id of the ``index``-th child a parent spawns in phase visit ``step``."""
    digest = hashlib.sha256(f"{parent}\x1f{step}\x1f{index}".encode()).hexdigest()[:16]
    return f"{kind}-{digest}"


def dispatch_row(intent: ToolIntent, ctx: TaskContext) -> OutboxRow:
    msg = ToolDispatch(session_id=ctx.session_id, run_id=intent.run_id, tool=intent.tool)
    return OutboxRow(subject=ctx.names.tool_subject(intent.tool), data=msg.to_json(),
                     headers=dict(intent.trace))


class PhaseContext:
    """The context of one phase run: read the task's world, stage its changes."""

    def __init__(self, task: Task, tc: TaskContext, registry: Registry) -> None:
        self.task = task
        self.input: dict[str, Any] = task.input
        #: The checkpoint data; changes made here are saved with the next step.
        self.data: dict[str, Any] = {
            k: copy.deepcopy(v) for k, v in task.checkpoint.data.items()
            if not k.startswith(PRIVATE)
        }
        self.now: int = tc.now()
        self.log = tc.log.bind(task_id=task.id, phase=task.checkpoint.phase)
        self._tc = tc
        self._registry = registry
        self._step = task.checkpoint.step
        self._documents: dict[str, dict[str, Any]] = {}
        self.children: list[Task] = []
        self.runs: list[ToolIntent] = []
        self.read_children: dict[str, Task] = {}
        self.read_runs: set[str] = set()

    @property
    def session_id(self) -> str:
        return self._tc.session_id

    # ------------------------------------------------------------------ documents

    def document(self, name: str) -> Any:
        """The document's current value (its model instance when typed), or None."""
        if name in self._documents:
            value: Any = self._documents[name]
        else:
            doc = self._tc.state.documents.get(name)
            if doc is None:
                return None
            value = doc.value
        kind = self._tc.app.documents.get(name)
        return kind.parse(value) if kind is not None else copy.deepcopy(value)

    def write_document(self, name: str, value: Any) -> None:
        """Stage a new version of the document (validated when the document is typed)."""
        check_name(name)
        kind = self._tc.app.documents.get(name)
        if kind is not None:
            data = kind.dump(value)
        elif isinstance(value, BaseModel):
            data = value.model_dump(mode="json")
        else:
            data = value
        if not isinstance(data, dict):
            raise ValidationError(f"document {name}: the value must be a JSON object")
        self._documents[name] = copy.deepcopy(data)

    # ------------------------------------------------------------------ children and tools

    def spawn(self, kind: str, input: dict[str, Any] | None = None) -> str:
        """Stage a child task of ``kind``; returns its id (the same when the phase reruns)."""
        defn = self._registry.definition(kind)
        if defn is None:
            raise ConfigError(f"cannot spawn {kind!r}: no such task kind is registered")
        cid = child_id(kind, self.task.id, self._step, len(self.children))
        self.children.append(Task(
            id=cid, kind=kind, version=defn.version, input=dict(input or {}),
            owner=self.task.id, parent=self.task.id, checkpoint=Checkpoint(phase=defn.start),
            created_ms=self.now, updated_ms=self.now,
        ))
        return cid

    def call_tool(self, tool: str, arguments: dict[str, Any] | None = None) -> str:
        """Stage a tool run (intent + dispatch); returns its run id.

        The arguments are validated now; the operation id is derived from the run id. A tool
        declared ``approval=True`` is dispatched only once a person approves these exact
        arguments (``baton approve``).
        """
        declared = self._tc.app.tools.get(tool)
        if declared is None:
            raise ConfigError(f"cannot call {tool!r}: no such tool is declared by the app")
        args = dict(arguments or {})
        declared.parse_args(args)
        run_id = f"{self.task.id}-{self._step}-{len(self.runs)}"
        self.runs.append(ToolIntent(
            run_id=run_id, session_id=self.session_id, task_id=self.task.id, tool=tool,
            tool_version=declared.version, arguments=args, replay=declared.replay,
            operation_id=f"{self.session_id}:{run_id}",
            wake_subject=self._tc.state.meta.wake_subject, created_ms=self.now,
            approval_digest=args_digest(tool, args) if declared.approval else None,
        ))
        return run_id

    def results(self, ids: list[str] | tuple[str, ...]) -> dict[str, ChildResult | ToolResult]:
        """The settled ones among these child tasks and tool runs, by id.

        A result is consumed by the commit of this phase (terminal children leave the live
        set, runs get their ``applied`` mark): read each result in the phase that follows
        the wait for it.
        """
        out: dict[str, ChildResult | ToolResult] = {}
        state = self._tc.state
        for i in ids:
            child = state.tasks.get(i)
            if child is not None and child.terminal and child.parent == self.task.id:
                self.read_children[i] = child
                out[i] = ChildResult(
                    id=i, kind=child.kind, outcome=child.state.outcome,  # type: ignore[union-attr]
                    result=child.result, reason=child.state.reason,  # type: ignore[union-attr]
                    input=child.input,
                )
                continue
            run = state.runs.get(i)
            if run is not None and run.status == "completed" and run.result is not None:
                self.read_runs.add(i)
                out[i] = run.result
        return out

    # ------------------------------------------------------------------ the commit

    def writes(self, kind: str) -> Writes:
        """The staged changes as a write-set (the task's own change is added by the caller)."""
        tc = self._tc
        w = Writes(kind=kind)
        w.tasks.extend(self.children)
        w.tasks.extend(self.read_children.values())  # consumed: terminal children leave
        w.applied.extend(sorted(self.read_runs))
        for intent in self.runs:
            w.runs.append(intent)
            if intent.approval_digest is not None:  # dispatched once approved
                w.awaiting[intent.run_id] = intent.approval_digest
            else:
                w.outbox.append(dispatch_row(intent, tc))
        for name, value in self._documents.items():
            current: Document | None = tc.state.documents.get(name)
            if current is not None and current.value == value:
                continue  # unchanged: no new version
            w.documents.append(next_change(current, name, value, self.now,
                                           tc.settings.document_baseline_every))
        return w
