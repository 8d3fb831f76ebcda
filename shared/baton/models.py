"""Typed state and wire models: everything stored in Redis or sent over NATS.

All models are frozen pydantic models that forbid unknown fields. Records that are stored or
sent on their own carry ``v``, the schema version: a reader that meets a version it does not
know rejects the record with a clear error instead of guessing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, Self, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from baton.errors import ValidationError

#: The name of an agent or a tool, as ``Agent`` and ``@tool`` declare it.
NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


def is_task_kind(kind: object) -> bool:
    """A kind a ``TaskDef`` may declare: not empty, without ``|`` (the separator of timer
    members), not ``generation`` (the agent loop's own)."""
    return isinstance(kind, str) and bool(kind) and "|" not in kind and kind != "generation"

SCHEMA_VERSION: Final = 1  # Final: its type is Literal[1], the type of Record.v
M = TypeVar("M", bound=BaseModel)

ReplayPolicy = Literal["safe", "confirm", "unsafe"]
WaitPolicy = Literal["allSettled", "failFast"]
Outcome = Literal["completed", "failed", "aborted", "interrupted", "orphaned", "cancelled"]
RunStatus = Literal["dispatched", "awaiting_approval", "running", "completed"]
ResultOutcome = Literal["ok", "error", "interrupted", "failed", "cancelled"]
Recovery = Literal["none", "reexecuted", "confirmed", "executed_after_confirm", "interrupted"]
Mark = Literal["accepted", "completed", "applied"]


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def to_json(self) -> str:
        # model_dump_json() with its defaults, without its keyword handling (dozens of
        # records per Brain pass): the same bytes.
        return self.__pydantic_serializer__.to_json(self).decode()

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """pydantic's shallow copy with ``update`` applied (unvalidated, as pydantic's is),
        without its three ``copy.copy`` calls: these models have no extra fields and no
        private attributes, and a Brain pass copies a few dozen of them."""
        if deep:
            return super().model_copy(update=update, deep=True)
        cls = type(self)
        copied = cls.__new__(cls)
        fields_set = set(self.__pydantic_fields_set__)
        if update:
            fields_set.update(update)
        object.__setattr__(copied, "__dict__", {**self.__dict__, **update} if update
                           else dict(self.__dict__))
        object.__setattr__(copied, "__pydantic_extra__", None)
        object.__setattr__(copied, "__pydantic_fields_set__", fields_set)
        object.__setattr__(copied, "__pydantic_private__", None)
        return copied


class Record(Model):
    v: Literal[1] = SCHEMA_VERSION


# ---------------------------------------------------------------------------- workers, marks
# (receipts, which use these, are typed in baton.receipts)


class WorkerRef(Model):
    role: str
    name: str
    pid: int


class MarkRef(Model):
    run_id: str
    mark: Mark
    attempt: int = 0


# ---------------------------------------------------------------------------- conversation


class ToolCall(Model):
    """A tool the model asks to run: ``name`` with ``arguments``, under an ``id`` its
    result refers to."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Usage(Model):
    """The tokens a model turn used, as its provider counted them."""

    input_tokens: int = 0
    output_tokens: int = 0


class Entry(Record):
    """An append-only fact of the conversation. Its index is its position in the list."""

    kind: Literal["user", "model", "tool_result", "interrupted", "system"]
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    run_id: str | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    is_error: bool = False
    task_id: str | None = None
    submission_id: str | None = None
    usage: Usage | None = None
    ts_ms: int = 0


class Document(Record):
    name: str
    version: int = 1
    value: dict[str, Any] = Field(default_factory=dict)
    updated_ms: int = 0


class Submission(Record):
    id: str
    session_id: str
    request_id: str
    agent: str
    text: str
    task_id: str
    status: Literal["accepted", "running", "completed", "failed", "cancelled"] = "accepted"
    answer: str | None = None
    error: str | None = None
    created_ms: int = 0
    settled_ms: int | None = None

    @property
    def settled(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")


# ---------------------------------------------------------------------------- tasks


class Pending(Model):
    name: Literal["pending"] = "pending"


class Running(Model):
    """Persisted before a phase with outside effects runs: on load it means a worker died here."""

    name: Literal["running"] = "running"
    worker: str = ""
    fence: int = 0
    since_ms: int = 0
    # Marked running in one commit together with other tasks: a worker that dies then is not
    # blamed on this task (it may not have started), which then re-runs on its own.
    shared: bool = False


class Waiting(Model):
    name: Literal["waiting"] = "waiting"
    on: tuple[str, ...]
    policy: WaitPolicy = "allSettled"


class Sleeping(Model):
    name: Literal["sleeping"] = "sleeping"
    until_ms: int


class Completing(Model):
    name: Literal["completing"] = "completing"
    outcome: Outcome
    reason: str = ""


class Terminal(Model):
    name: Literal["terminal"] = "terminal"
    outcome: Outcome
    reason: str = ""


TaskState = Annotated[
    Pending | Running | Waiting | Sleeping | Completing | Terminal, Field(discriminator="name")
]


class Checkpoint(Model):
    phase: str
    data: dict[str, Any] = Field(default_factory=dict)
    # Phase transitions so far: with the phase, it makes the ids a phase creates unique to
    # this visit and the same when a crashed visit runs again.
    step: int = 0


class Task(Record):
    """A unit of durable work in a session: a generation (the model loop) or a custom task
    (:class:`~baton.brain.tasks.TaskDef`). ``state`` is pending, running, waiting, sleeping
    or terminal (``state.name``; terminal states carry an ``outcome``); ``checkpoint`` holds
    the phase it runs and the data it carries."""

    id: str
    kind: str
    version: int = 1
    input: dict[str, Any] = Field(default_factory=dict)
    owner: str  # the session id, or the parent task id
    parent: str | None = None
    submission_id: str | None = None
    state: TaskState = Field(default_factory=Pending)
    checkpoint: Checkpoint = Field(default_factory=lambda: Checkpoint(phase="start"))
    crashes: int = 0  # consecutive times a worker died in the current phase
    cancel_requested: bool = False
    result: Any = None
    created_ms: int = 0
    updated_ms: int = 0

    @property
    def terminal(self) -> bool:
        return self.state.name == "terminal"


# ---------------------------------------------------------------------------- tool runs


class ToolIntent(Record):
    """What the Brain decided, saved before the first attempt; never changes afterwards."""

    run_id: str
    session_id: str
    task_id: str
    tool: str
    tool_version: int = 1
    arguments: dict[str, Any] = Field(default_factory=dict)
    replay: ReplayPolicy = "unsafe"
    operation_id: str
    tool_call_id: str | None = None
    wake_subject: str
    group: str | None = None  # runs awaited together: only the last completion wakes the Brain
    wake_each: bool = False
    created_ms: int = 0
    trace: dict[str, str] = Field(default_factory=dict)
    # Set for a tool declared approval=True: the digest of (tool, arguments) an approval
    # must present (baton.store.control.args_digest); no dispatch until it is approved.
    approval_digest: str | None = None


class ToolResult(Record):
    outcome: ResultOutcome
    output: Any = None
    error_code: str | None = None
    error: str | None = None
    recovery: Recovery = "none"
    attempt: int = 0
    duration_ms: float = 0.0
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


class ToolRun(Model):
    """A tool run as loaded: the intent plus the marks the scripts maintain."""

    intent: ToolIntent
    status: RunStatus = "dispatched"
    attempt: int = 0
    accepted_ms: int | None = None
    completed_ms: int | None = None
    applied_ms: int | None = None
    heartbeat_ms: int | None = None
    worker: str | None = None
    result: ToolResult | None = None
    attempts: tuple[dict[str, Any], ...] = ()
    cancel_ms: int | None = None  # when the Brain asked it to stop
    approved_ms: int | None = None  # when a person approved it (approval-gated tools)

    @property
    def run_id(self) -> str:
        return self.intent.run_id

    @property
    def live(self) -> bool:
        """No result yet (dispatched, awaiting approval or running)."""
        return self.status != "completed"


# ---------------------------------------------------------------------------- session


class SessionMeta(Model):
    session_id: str
    agent: str
    compat: int
    wake_subject: str
    fence: int = 0
    holder: str = ""
    lease_until_ms: int = 0
    seq: int = 0
    dirty: bool = False
    created_ms: int = 0
    # The holder kept its lease for the results of the runs it dispatched and listens for
    # them under this name (baton.brain.held); "" otherwise. Written by the store, read by
    # inspect; a Brain's in-memory state does not follow it.
    listen: str = ""
    groups: dict[str, int] = Field(default_factory=dict)
    # Cancel intents not yet consumed by a Brain: task ids, "*" for the whole session.
    cancels: tuple[str, ...] = ()
    cancel_reasons: dict[str, str] = Field(default_factory=dict)  # target -> reason given
    # Tasks no Brain could run when it last looked, with the reason (task id -> reason).
    blocked: dict[str, str] = Field(default_factory=dict)
    # Whose work the session is (named by the request that opened it; "" for the default
    # tenant): tenants take turns for capped tools and budgeted models (baton.store.admission).
    tenant: str = ""
    # The fence of the last holder that handed the session over mid-pass, its Brain stopping
    # (release.lua's handover); 0 when none has.
    handed: int = 0

    def handed_over(self, fence: int) -> bool:
        """Whether the holder of ``fence`` handed the session over (its pass stopped on
        purpose, a graceful stop) rather than leaving it by dying: a phase it left running is
        then re-entered without counting a crash."""
        return fence > 0 and fence == self.handed


# ---------------------------------------------------------------------------- outbox and wire


class OutboxRow(Model):
    subject: str
    data: str  # JSON of a wire message
    headers: dict[str, str] = Field(default_factory=dict)
    id: str = ""  # assigned by the commit script: "<session>/<seq>/<n>"; the Nats-Msg-Id
    session_id: str = ""
    ts_ms: int = 0
    stream_id: str = ""  # the Redis stream entry id, for acknowledging


# Wire fields name Redis keys and NATS subjects: a value outside these shapes is rejected at
# decoding (and dead-lettered), never carried to a key or subject.
WireSessionId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")]
WireRunId = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\s]+$")]
WireToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class Wake(Record):
    """``<ns>.wake.<agent>.<compat>``: session S has runnable work."""

    session_id: WireSessionId
    reason: str = "commit"
    # The session's first wake, let through by fair admission (baton.store.admission): the
    # Brain that receives it frees its place for the next new session of its shard.
    admitted: bool = False


class ToolDispatch(Record):
    """``<ns>.tool.<tool>``: execute tool run R of session S."""

    session_id: WireSessionId
    run_id: WireRunId
    tool: WireToolName


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def loads(data: str | bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValidationError(f"malformed JSON: {exc}") from None


def decode(model: type[M], data: str | bytes) -> M:
    """Parse and validate a stored record or wire message; a clear ValidationError otherwise."""
    try:  # model_validate_json() without its keyword handling: the same validation
        return model.__pydantic_validator__.validate_json(data)  # type: ignore[no-any-return]
    except PydanticValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise ValidationError(
            f"invalid {model.__name__}: {where}: {first['msg']}", model=model.__name__
        ) from None
