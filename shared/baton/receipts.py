"""Receipts, typed: one model per kind of line in a session's commit log.

A receipt is written in two layouts (see the scripts in ``baton/store/lua``): a script that
decides everything itself (``acquire``, ``claim``, the refusals) encodes a flat JSON object;
a transition whose caller describes it (``commit``, ``complete``, ``submit`` ...) passes an
envelope ``{"kind"?, "marks", "changes", "detail", "trace"}``. :meth:`Receipt.from_stream`
reads either into one :class:`Receipt` whose ``detail`` is a member of :data:`ReceiptDetail`,
a union discriminated on ``kind``. Readers (trace, watch, demo, chaos checks) use the typed
attributes and never look into raw dicts.

Why details ignore unknown fields (``extra="ignore"``) instead of forbidding them: the log
outlives the code that wrote it. During a rolling upgrade old and new workers append to the
same stream, and an operator's ``baton trace`` may be older or newer than both; a field added
by a newer writer must not make an older reader fail. For the same reason a kind this reader
does not know, or a known kind whose fields do not validate, decodes as :class:`OtherDetail`
(its fields kept as they were) rather than raising. Receipts are a view, not an input that
drives a transition: strictness that protects keys and subjects lives on the command wire.

:class:`Carrier` is what a consumer learned about the message that made it act (the relay
that published it, when, its stream sequence and delivery count). It comes from NATS headers,
so every field is bounded and validated here before it is stored.

**Who wrote a receipt.** Each role appends to a receipts stream of its own (the Brains'
``receipts``, ``receipts_hands``, ``receipts_client``; see baton.store.keys), where only its
Redis ACL user may write, and readers merge the three by id (:func:`receipt_order`).
:attr:`Receipt.stream_role` is the stream a receipt was read from, and :attr:`Receipt.role`
the role it is attributed to: the stream's, whatever role its ``worker`` claims, so a Hands or
a client cannot pass a receipt off as a Brain's (or each other's). The one exception is the
Brains' stream, which before per-role streams held every role's receipts (sessions written
then keep them there): a receipt there that claims another role keeps its claim. Either way
a receipt whose claimed role is not its stream's is flagged (:attr:`Receipt.mismatch`).
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    model_validator,
)
from pydantic import ValidationError as PydanticValidationError

from baton.models import MarkRef, Usage, WorkerRef, loads

__all__ = [
    "ROLE_KINDS", "ApprovalDetail", "CancelDetail", "Carrier", "ClaimDetail", "CommitDetail",
    "CompleteDetail", "HeldDetail", "LeaseDetail", "OtherDetail", "PartialDetail", "Receipt",
    "ReceiptDetail", "RefusedDetail", "RestoredDetail", "StartDetail", "SubmitDetail",
    "id_order", "receipt_order",
]

_MAX_MS = 2**53  # a JSON-safe integer; no real timestamp or counter comes near it
Name = Annotated[str, Field(max_length=256)]
Count = Annotated[int, Field(ge=0, le=_MAX_MS)]


class Carrier(BaseModel):
    """How a message reached the process that acted on it (from the message's NATS headers).

    ``row_id`` is the outbox row (the ``Nats-Msg-Id``): ``<session>/<seq>/<n>`` names the
    commit that wrote it, ``t/<timer>/<due>`` a fired timer.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    relay: str = Field(default="", pattern=r"^[A-Za-z0-9_.:@-]{0,128}$")
    published_ms: Count = 0
    row_id: str = Field(default="", max_length=512, pattern=r"^[^\s]*$")
    stream_seq: Count = 0
    delivery: int = Field(default=1, ge=1, le=1_000_000)

    @property
    def source_seq(self) -> int | None:
        """The commit sequence that wrote the row (None for a timer or an unknown id)."""
        if self.row_id.startswith("t/"):
            return None
        parts = self.row_id.rsplit("/", 2)
        return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None

    @property
    def timer(self) -> bool:
        return self.row_id.startswith("t/")


class _Detail(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    @property
    def task_ref(self) -> str:
        """The task this receipt is about ("" when none)."""
        return str(getattr(self, "task_id", ""))

    @property
    def run_refs(self) -> frozenset[str]:
        """The tool runs this receipt is about: its run and the runs it dispatched."""
        run = getattr(self, "run_id", "")
        return frozenset({run} if run else ())


class LeaseDetail(_Detail):
    """``lease`` / ``takeover`` (acquire.lua): a Brain took the session lease."""

    kind: Literal["lease", "takeover"]
    previous_holder: Name = ""
    previous_fence: Count = 0
    carrier: Carrier | None = None  # the wake that started this pass


class HeldDetail(_Detail):
    """``held`` (release.lua): a Brain that kept its lease after dispatching tool runs
    (baton.brain.held) rechecked the session, the lease kept: the results came to it
    without a wake. ``heard``: told, by a signal on its hold channel or by a wake of the
    session it received meanwhile (else its hold ran its length and its release found them)."""

    kind: Literal["held"]
    heard: bool = True
    hold_ms: Count = 0  # how long it held, from its commit to its release


class ClaimDetail(_Detail):
    """``claim`` / ``reclaim`` (claim.lua): a Hands attempt claimed a run (mark accepted)."""

    kind: Literal["claim", "reclaim"]
    run_id: Name
    attempt: Count = 0
    previous_attempt: Count = 0
    previous_status: Name = ""
    previous_worker: Name = ""
    accepted_mark: bool = False  # this claim wrote the run's 'accepted' mark (its first)
    delivery: int = 1
    carrier: Carrier | None = None  # the tool message that was claimed


class CompleteDetail(_Detail):
    """``complete`` (complete.lua, built by Runs.complete): mark completed."""

    kind: Literal["complete"]
    run_id: Name
    tool: Name = ""
    outcome: Name = ""
    recovery: Name = "none"
    duration_ms: float = 0.0
    delivery: int = 1


class SlotWaitDetail(_Detail):
    """``slot_wait`` (slot_wait.lua): a run of a tool capped for the fleet waits for one of
    its slots (``state`` waiting, ``position`` its place in line, 0: first, waiting for the
    tool's rate only), got one (granted) or stopped waiting because its Hands stopped (left);
    ``waited_ms``: how long it waited, as its Hands measured it."""

    kind: Literal["slot_wait"]
    run_id: Name
    tool: Name = ""
    state: Literal["waiting", "granted", "left"] = "waiting"
    position: Count = 0
    waited_ms: Count = 0


class RefusedDetail(_Detail):
    """``refused``: a stale write (commit, renew, complete, heartbeat) or a bad approval."""

    kind: Literal["refused"]
    op: Name = "write"
    current: Count = 0
    run_id: Name = ""
    status: Name = ""
    presented: Name = ""
    expected: Name = ""


class SubmitDetail(_Detail):
    kind: Literal["submit"]
    submission_id: Name = ""
    request_id: Name = ""
    task_id: Name = ""


class StartDetail(_Detail):
    kind: Literal["start"]
    task_id: Name = ""
    task_kind: Name = ""
    request_id: Name = ""


class PartialDetail(_Detail):
    """``partial`` (partial.lua): streamed text saved; ``delta`` is the new text, ``stream_ms``
    when the Brain sent the save (ms since the stream began, on the Brain's throttle clock)."""

    kind: Literal["partial"]
    task_id: Name = ""
    request_id: Name = ""
    delta: str = ""
    chars: Count = 0
    stream_ms: Count = 0


class CancelDetail(_Detail):
    kind: Literal["cancel"]
    target: Name = "*"
    reason: str = "cancelled"


class ApprovalDetail(_Detail):
    """``approve`` / ``reject`` (approve.lua): a person decided on a gated run."""

    kind: Literal["approve", "reject"]
    run_id: Name = ""
    tool: Name = ""
    digest: Name = ""
    decision: Name = ""
    reason: str = ""


class CommitDetail(_Detail):
    """``commit`` (commit.lua): a Brain's write-set. ``step`` is what the commit did.

    Steps: prepare, reenter, request attempts (retry, resume), tools, redispatch, apply, final,
    cancel, decisions (a person's approvals and rejections carried out), migrate, blocked,
    run, phase_failed and ``phase:<name>`` for custom tasks (whose own step kind is
    ``phase_step``). Each fills the fields that apply to it.
    """

    kind: Literal["commit"]
    step: Name = "commit"
    task_id: Name = ""
    phase: Name = ""
    phase_step: Name = ""
    turn: Count = 0
    runs: tuple[Name, ...] = ()
    applied: tuple[Name, ...] = ()
    tasks: tuple[Name, ...] = ()
    crashes: Count = 0
    reentered: dict[str, int] = Field(default_factory=dict)
    interrupted: Name = ""
    outcome: Name = ""
    state: Name = ""
    reason: str = ""
    error: str = ""
    status: int | str | None = None
    request_id: Name = ""
    provider_request_id: Name = ""
    attempt: Count = 0
    usage: Usage | None = None
    until_ms: Count = 0
    retry_in_ms: int = 0
    compat_from: int = Field(default=0, alias="from")
    compat_to: int = Field(default=0, alias="to")
    wake_subject: Name = ""
    migrated: dict[str, tuple[int, int]] = Field(default_factory=dict)
    blocked: dict[str, str] = Field(default_factory=dict)
    cleared: tuple[Name, ...] = ()
    intents: tuple[Name, ...] = ()
    targets: tuple[Name, ...] = ()
    approved: tuple[Name, ...] = ()  # decisions: approved runs, dispatched by this commit
    rejected: tuple[Name, ...] = ()  # decisions: rejected runs, ended by this commit

    @property
    def run_refs(self) -> frozenset[str]:
        return frozenset(self.runs)


class RestoredDetail(_Detail):
    """``restored`` (restore.lua): a Brain brought the archived session back into Redis; the
    receipts before it are the archived ones, as they were."""

    kind: Literal["restored"]
    archived_ms: int = 0  # when the session had been archived
    object: str = ""  # the archive object it was restored from


class OtherDetail(_Detail):
    """A kind this reader does not know (a newer writer), or one whose fields did not decode.

    The fields are kept as written (``model_extra``) so a trace can still show them.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    kind: str
    undecodable: str = ""  # why a known kind fell back here

    @property
    def fields(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


_TAGS = {
    "lease": "lease", "takeover": "lease", "held": "held", "claim": "claim", "reclaim": "claim",
    "complete": "complete", "refused": "refused", "submit": "submit", "start": "start",
    "partial": "partial", "cancel": "cancel", "approve": "approval", "reject": "approval",
    "commit": "commit", "restored": "restored", "slot_wait": "slot_wait",
}


def _tag(value: Any) -> str:
    if isinstance(value, OtherDetail):
        return "other"
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return _TAGS.get(str(kind), "other")


ReceiptDetail = Annotated[
    Annotated[LeaseDetail, Tag("lease")]
    | Annotated[HeldDetail, Tag("held")]
    | Annotated[ClaimDetail, Tag("claim")]
    | Annotated[CompleteDetail, Tag("complete")]
    | Annotated[RefusedDetail, Tag("refused")]
    | Annotated[SubmitDetail, Tag("submit")]
    | Annotated[StartDetail, Tag("start")]
    | Annotated[PartialDetail, Tag("partial")]
    | Annotated[CancelDetail, Tag("cancel")]
    | Annotated[ApprovalDetail, Tag("approval")]
    | Annotated[CommitDetail, Tag("commit")]
    | Annotated[RestoredDetail, Tag("restored")]
    | Annotated[SlotWaitDetail, Tag("slot_wait")]
    | Annotated[OtherDetail, Tag("other")],
    Discriminator(_tag),
]


class Receipt(BaseModel):
    """One line of a session's commit log: who wrote it, under which fence, and what."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    v: Literal[1] = 1
    stream_id: str = ""  # the Redis stream entry id (resume point of ``watch``)
    #: the role whose receipts stream this was read from ("": not known, e.g. a receipt saved
    #: to a file before per-role streams)
    stream_role: Literal["brain", "hands", "client", ""] = ""
    seq: int = 0  # the commit sequence (0 for leases, claims and refusals)
    ts_ms: int = 0
    worker: WorkerRef | None = None
    fence: int = 0
    marks: tuple[MarkRef, ...] = ()
    changes: dict[str, int] = Field(default_factory=dict)
    trace: dict[str, str] = Field(default_factory=dict)
    detail: ReceiptDetail

    @property
    def kind(self) -> str:
        return self.detail.kind

    @property
    def role(self) -> str:
        """The role this receipt is attributed to: its stream's (only that role may append
        to it), but in the Brains' stream, or one not known, the role its worker claims when
        that is a Hands or a client (see the module's doc)."""
        claimed = self.worker.role if self.worker is not None else ""
        if self.stream_role in ("hands", "client"):
            return self.stream_role
        if claimed in ("hands", "client") or not self.stream_role:
            return claimed
        return "brain"

    @property
    def foreign(self) -> bool:
        """Whether it is of a kind the role it is attributed to never writes (a ``commit`` in
        the Hands' stream, a ``claim`` in the clients'): forged; a reader shows it, flagged,
        and never reads it as that act."""
        kinds = ROLE_KINDS.get(self.role)
        return kinds is not None and self.kind in _TAGS and self.kind not in kinds

    @property
    def mismatch(self) -> bool:
        """Whether its worker claims another role than its stream's: forged (a Hands or a
        client writing as another role) or, in the Brains' stream, written before per-role
        streams; never trusted as the claimed role's act."""
        return (bool(self.stream_role) and self.worker is not None
                and self.worker.role != self.stream_role)

    @model_validator(mode="before")
    @classmethod
    def _fallback(cls, data: Any) -> Any:
        """Accept the earlier saved layout (``kind`` beside a free-form ``detail``) and turn
        a known kind whose fields do not validate into :class:`OtherDetail`."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        detail = data.get("detail")
        if isinstance(detail, dict):
            detail = dict(detail)
            if "kind" not in detail and "kind" in data:
                detail["kind"] = data["kind"]
            if "stream_id" in detail:
                data.setdefault("stream_id", detail.pop("stream_id"))
            data["detail"] = _detail_or_other(detail)
        return data

    @classmethod
    def from_stream(cls, stream_id: str, f: dict[str, str],
                    role: Literal["brain", "hands", "client", ""] = "") -> Receipt:
        """Decode one entry of a receipts stream (fields seq, kind, worker, fence, ts, data);
        ``role``: the role whose stream it was read from."""
        kind = f.get("kind", "")
        data = loads(f.get("data") or "{}")
        if not isinstance(data, dict):
            data = {}
        top_kind = data.pop("kind", None)  # a commit's step, in the envelope layout
        envelope = {k: data.pop(k) for k in ("marks", "changes", "detail", "trace") if k in data}
        detail = dict(envelope.get("detail") or {})
        if kind == "commit" and "step" in detail:
            detail["phase_step"] = detail.pop("step")  # a custom phase's own step kind
        if "kind" in detail:
            detail["task_kind"] = detail.pop("kind")  # e.g. the kind of a started task
        body: dict[str, Any] = {**data, **detail, "kind": kind}
        if kind == "commit" and top_kind:
            body["step"] = top_kind
        marks = list(envelope.get("marks") or [])
        if kind in ("claim", "reclaim") and body.get("accepted_mark") in (1, True):
            marks.append({"run_id": body.get("run_id", ""), "mark": "accepted",
                          "attempt": body.get("attempt", 0)})
        worker = loads(f["worker"]) if f.get("worker", "").startswith("{") else None
        return cls.model_validate({
            "stream_id": stream_id,
            "stream_role": role,
            "seq": int(f.get("seq", 0)),
            "ts_ms": int(f.get("ts", 0)),
            "worker": worker,
            "fence": int(f.get("fence", 0)),
            "marks": marks,
            "changes": envelope.get("changes") or {},
            "trace": envelope.get("trace") or {},
            "detail": body,
        })


_ROLE_RANK = {"brain": 0, "hands": 1, "client": 2, "": 3}

#: The kinds of receipt each role's scripts write (baton/store/lua).
ROLE_KINDS: dict[str, frozenset[str]] = {
    "brain": frozenset({"lease", "takeover", "held", "commit", "partial", "refused",
                        "restored"}),
    "hands": frozenset({"claim", "reclaim", "complete", "refused", "slot_wait"}),
    "client": frozenset({"submit", "start", "cancel", "approve", "reject", "refused"}),
}


def id_order(stream_id: str) -> tuple[int, int]:
    """A stream id (``<ms>-<seq>``) as the pair it is ordered by."""
    ms, _, seq = stream_id.partition("-")
    return (int(ms) if ms.isdigit() else 0, int(seq) if seq.isdigit() else 0)


def receipt_order(r: Receipt) -> tuple[int, int, int]:
    """The place of a receipt in the session's merged receipts: by stream id (the scripts
    give the three streams' receipts ids in the order they were written, see receipt_id in
    baton/store/lua/_lib.lua), then by role (ids a forged receipt shares with another)."""
    return (*id_order(r.stream_id), _ROLE_RANK[r.stream_role])


def _detail_or_other(body: dict[str, Any]) -> Any:
    if _tag(body) == "other":
        return body
    try:
        return _adapter().validate_python(body)
    except PydanticValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or "(root)"
        return OtherDetail.model_validate({**body, "undecodable": f"{where}: {first['msg']}"})


@functools.cache
def _adapter() -> TypeAdapter[Any]:
    """Built when a receipt is first read (inspect, trace): workers only write receipts."""
    return TypeAdapter(ReceiptDetail)
