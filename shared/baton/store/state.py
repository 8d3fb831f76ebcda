"""A session's state as Python sees it: the types the store returns and the pure parsers.

Owns :class:`SessionState` (a consistent snapshot) with its lazily decoded :class:`Entries`,
the transition outcomes (:class:`Lease`, :class:`Claim`, :class:`Partial`), the parsers that
turn Redis hashes and stream rows into models (:func:`parse_meta`, :func:`parse_runs`,
:func:`parse_receipt`, :func:`merge_receipts`) and :func:`receipts_about`. Nothing here
talks to Redis.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, overload

from baton.errors import CorruptStateError, ValidationError
from baton.models import (
    Document,
    Entry,
    SessionMeta,
    Submission,
    Task,
    ToolIntent,
    ToolResult,
    ToolRun,
    decode,
    loads,
)
from baton.receipts import Receipt, receipt_order
from baton.store.keys import ReceiptRole


@dataclass(frozen=True, slots=True)
class Lease:
    session_id: str
    fence: int
    takeover: bool
    previous_holder: str


@dataclass(frozen=True, slots=True)
class Claim:
    """The outcome of a Hands claim (see claim.lua)."""

    status: Literal["claimed", "busy", "done", "gone"]
    attempt: int = 0
    previous_attempt: int = 0
    previous_status: str = ""
    intent: ToolIntent | None = None
    previous_worker: str = ""
    holder: str = ""
    remaining_ms: int = 0
    cancelled: bool = False  # the Brain asked the run to stop: complete it as cancelled

    @property
    def recovering(self) -> bool:
        """An earlier attempt ended without a result: the replay policy decides."""
        return self.status == "claimed" and self.previous_attempt > 0


@dataclass(frozen=True, slots=True)
class Partial:
    """Text a model was streaming when the last partial commit saved it (partial.lua)."""

    task_id: str
    request_id: str
    text: str


class Entries(Sequence[Entry]):
    """A page of entries, each decoded only when read: most steps never look at them.

    A Brain step that applies tool results or marks a phase running does not need the
    conversation; the model request that does pays for exactly what it reads.
    """

    def __init__(self, raw: Iterable[str | Entry] = (), *, session_id: str = "",
                 start: int = 0) -> None:
        self._items: list[str | Entry] = list(raw)
        self._session_id = session_id  # named in the error when an entry does not parse
        self._start = start  # the index of the first item in the session's entries

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Entry: ...
    @overload
    def __getitem__(self, index: slice) -> list[Entry]: ...

    def __getitem__(self, index: int | slice) -> Entry | list[Entry]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self._items)))]
        item = self._items[index]
        if isinstance(item, str):
            try:
                item = self._items[index] = decode(Entry, item)
            except ValidationError as exc:  # stored state, not input: the session is poison
                at = self._start + (index if index >= 0 else len(self._items) + index)
                raise CorruptStateError(
                    self._session_id, f"entry {at} does not parse: {exc}") from None
        return item

    def __iter__(self) -> Iterator[Entry]:
        items = self._items
        for i in range(len(items)):
            item = items[i]
            yield self[i] if isinstance(item, str) else item

    def decode_all(self) -> None:
        """Decode every entry now (CorruptStateError when one does not parse)."""
        for i in range(len(self._items)):
            self[i]

    def extend(self, entries: Iterable[Entry]) -> None:
        self._items.extend(entries)

    def append(self, entry: Entry) -> None:
        self._items.append(entry)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"Entries({len(self._items)})"


@dataclass(frozen=True, slots=True)
class Decision:
    """A person's decision on a run awaiting approval (inbox ``decide:<run id>``)."""

    decision: Literal["approve", "reject"]
    ms: int
    result: str = ""  # the ToolResult JSON a rejection ends the run with


def parse_decisions(inbox: dict[str, str]) -> dict[str, Decision]:
    """The decisions recorded in a session's inbox (unreadable ones are skipped: a client
    wrote them, and a decision must parse to be carried out)."""
    out = {}
    for name, raw in inbox.items():
        if not name.startswith("decide:"):
            continue
        try:
            d = loads(raw)
            out[name[7:]] = Decision(
                "reject" if d["decision"] == "reject" else "approve", int(d["ms"]),
                str(d.get("result") or ""))
        except (ValueError, KeyError, TypeError):
            continue
    return out


@dataclass(frozen=True, slots=True)
class Request:
    """A client's submit or start request waiting in the session's inbox
    (``submit:<request id>`` / ``start:<request id>``): what the Brain's commit writes."""

    field: str  # the inbox field, deleted by the commit that takes it up
    request_id: str
    agent: str
    task: Task
    submission: Submission | None = None  # submit only, with its user entry
    entry: Entry | None = None


#: The inbox fields of requests that ask for work (a submit, a start), as opposed to
#: decisions about work already there (cancel, approve, reject).
REQUEST_FIELDS = ("submit:", "start:")


def is_request(field: str) -> bool:
    """Whether an inbox field is a submit or start request (work no Brain took up yet)."""
    return field.startswith(REQUEST_FIELDS)


def parse_requests(inbox: dict[str, str]) -> list[Request]:
    """The submit and start requests in a session's inbox, in the order they were made
    (unreadable ones are skipped: a client wrote them)."""
    out = []
    for name, raw in inbox.items():
        kind, _, rid = name.partition(":")
        if kind not in ("submit", "start"):
            continue
        try:
            r = loads(raw)
            task = decode(Task, r["task"])
            if kind == "submit":
                out.append(Request(name, rid, str(r["agent"]), task,
                                   decode(Submission, r["sub"]), decode(Entry, r["entry"])))
            else:
                out.append(Request(name, rid, str(r["agent"]), task))
        except (ValueError, KeyError, TypeError, CorruptStateError, ValidationError):
            continue
    return sorted(out, key=lambda q: (q.task.created_ms, q.field))


def requested_meta(inbox: dict[str, str]) -> dict[str, str]:
    """The meta a session not opened yet will have, from its first waiting submit or start
    request (as acquire.lua opens it), or {} without one."""
    for name in sorted(inbox):
        if not is_request(name):
            continue
        try:
            r = loads(inbox[name])
            return {"agent": str(r["agent"]), "compat": str(int(r["compat"])),
                    "wake": str(r["wake"]), "fence": "0", "seq": "0", "holder": "",
                    "lease_until": "0"}
        except (ValueError, KeyError, TypeError):
            continue
    return {}


def pending_submission(inbox: dict[str, str], submission_id: str) -> Submission | None:
    """A submission whose request waits in the inbox, not taken up by a Brain yet."""
    for q in parse_requests(inbox):
        if q.submission is not None and q.submission.id == submission_id:
            return q.submission
    return None


def pending_task(inbox: dict[str, str], task_id: str) -> Task | None:
    """A task whose submit or start request waits in the inbox."""
    for q in parse_requests(inbox):
        if q.task.id == task_id:
            return q.task
    return None


@dataclass
class SessionState:
    """A session's live state as one consistent snapshot."""

    meta: SessionMeta
    tasks: dict[str, Task] = field(default_factory=dict)
    documents: dict[str, Document] = field(default_factory=dict)
    # The submissions of the live tasks (the open ones, meta's 'sub:<id>'): the subs hash
    # keeps every one, for the client's and the operators' reads (baton.store.loading).
    submissions: dict[str, Submission] = field(default_factory=dict)
    runs: dict[str, ToolRun] = field(default_factory=dict)
    entry_count: int = 0
    entries: Entries = field(default_factory=lambda: Entries())  # the newest page
    # A person's decisions on runs awaiting approval, recorded by clients in the session's
    # inbox and not yet carried out: run id -> Decision.
    decisions: dict[str, Decision] = field(default_factory=dict)
    # Clients' submit and start requests not taken up yet (see parse_requests).
    requests: list[Request] = field(default_factory=list)

    @property
    def entries_start(self) -> int:
        return self.entry_count - len(self.entries)


#: Fields of a live run that the Brain (or a person's decision) keeps beside its intent in
#: the intents hash, as ``<run id>.<field>``, where the Hands cannot write: its status
#: before any claim (dispatched, awaiting_approval, or completed when it was ended without
#: the Hands, with that result), the mark asking it to stop, what an approval must present.
BRAIN_RUN_FIELDS = ("status", "cancel", "digest", "approved", "result", "completed")
_ENDING = ("status", "result", "completed")  # the Brain's, when it ended the run itself
_BRAIN_ONLY = frozenset(("intent", "cancel", "digest", "approved"))  # never the Hands'
# The same test as a field's last dotted part being one of them, in one C call per field
# (a load scans every field of the runs hash): "<run>.<field>", or the bare name.
_BRAIN_ONLY_SUFFIXES = tuple(f".{f}" for f in _BRAIN_ONLY)


def run_status(brain: str | None, hands: str | None) -> str | None:
    """A live run's status from the Brain's and the Hands' (as _lib.lua's run_status): an
    approval still awaited or an ending decided without the Hands wins."""
    if brain in ("completed", "awaiting_approval") or hands is None:
        return brain
    return hands


def with_intents(runs: dict[str, str], intents: dict[str, str]) -> dict[str, str]:
    """The runs hash (the Hands' records) and the intents hash (the Brain's: each live run's
    committed intent and :data:`BRAIN_RUN_FIELDS`, group counts) merged into one
    ``<run>.<field>`` mapping for :func:`parse_runs` and :func:`parse_meta`.

    Intent, cancel mark, digest and approval found in the runs hash are dropped: the Hands
    write that hash, and a run the Brain never committed (or a mark it never set) must not
    appear in its state. ``grp:<group>`` becomes the number of results the group still
    awaits: the Brain's count less the Hands' (dropped at zero)."""
    merged = {k: v for k, v in runs.items()
              if not (k.endswith(_BRAIN_ONLY_SUFFIXES) or k.startswith("grp:")
                      or k in _BRAIN_ONLY)}
    for name, value in intents.items():
        if name == "gc":
            continue
        if name.startswith("grp:"):
            try:
                left = int(value) - int(runs.get(name, 0))
            except ValueError:  # kept as found, for parse_meta or inspect to report
                merged[name] = f"{value}-{runs.get(name, 0)}"
                continue
            if left > 0:
                merged[name] = str(left)
            continue
        rid, dot, attr = name.rpartition(".")
        if not (dot and attr in BRAIN_RUN_FIELDS):
            merged[f"{name}.intent"] = value
        elif attr not in _ENDING:
            merged[name] = value
    for name, value in intents.items():
        rid, dot, attr = name.rpartition(".")
        if dot and attr == "status":
            hands = runs.get(name)
            if value == "completed":  # ended without the Hands: its own result
                for f in _ENDING:
                    merged.pop(f"{rid}.{f}", None)
                    if f"{rid}.{f}" in intents:
                        merged[f"{rid}.{f}"] = intents[f"{rid}.{f}"]
            else:
                merged[name] = run_status(value, hands) or value
    return merged


def parse_runs(fields: dict[str, str]) -> dict[str, ToolRun]:
    grouped: dict[str, dict[str, str]] = {}
    for name, value in fields.items():
        rid, _, attr = name.rpartition(".")
        if (f := grouped.get(rid)) is None:
            grouped[rid] = f = {}
        f[attr] = value
    runs = {}
    for rid, f in grouped.items():
        intent = f.get("intent")
        if intent is None:
            continue
        get = f.get
        result, attempts = get("result"), get("attempts")
        runs[rid] = ToolRun(
            intent=decode(ToolIntent, intent),
            status=get("status", "dispatched"),  # type: ignore[arg-type]
            attempt=int(get("attempt", 0)),
            accepted_ms=_int(get("accepted")),
            completed_ms=_int(get("completed")),
            applied_ms=_int(get("applied")),
            heartbeat_ms=_int(get("heartbeat")),
            worker=get("worker"),
            result=decode(ToolResult, result) if result else None,
            attempts=tuple(loads(attempts)) if attempts else (),
            cancel_ms=_int(get("cancel")),
            approved_ms=_int(get("approved")),
        )
    return runs


def parse_meta(session_id: str, m: dict[str, str], runs: dict[str, str] | None = None,
               nudge: str | None = None, inbox: dict[str, str] | None = None) -> SessionMeta:
    """The session hash as a model. Group counters come with the run records (``runs``
    as :func:`with_intents` merges them, fields ``grp:<group>``) and the Hands' and timers'
    dirty mark in the ``nudge`` key, clients' cancel intents in the ``inbox``: pass them to
    get the whole picture."""
    groups = {k[4:]: int(v) for k, v in (runs or {}).items() if k.startswith("grp:")}
    return SessionMeta(
        session_id=session_id,
        agent=m["agent"],
        compat=int(m["compat"]),
        wake_subject=m["wake"],
        fence=int(m.get("fence", 0)),
        holder=m.get("holder", ""),
        lease_until_ms=int(m.get("lease_until", 0)),
        seq=int(m.get("seq", 0)),
        dirty=m.get("dirty") == "1" or nudge is not None,
        created_ms=int(m.get("created", 0)),
        listen=m.get("listen", ""),
        groups=groups,
        cancels=tuple(sorted({k[7:] for k in (*m, *(inbox or {})) if k.startswith("cancel:")})),
        cancel_reasons=_cancel_reasons(inbox),
        blocked={k[8:]: v for k, v in m.items() if k.startswith("blocked:")},
        tenant=m.get("tenant", ""),
        handed=int(m.get("handed", 0)),
    )


def _cancel_reasons(inbox: dict[str, str] | None) -> dict[str, str]:
    """The reasons clients gave their cancel intents (``{"at", "reason"}``; a bare time has
    none)."""
    out = {}
    for k, v in (inbox or {}).items():
        if k.startswith("cancel:") and v.startswith("{"):
            try:
                reason = loads(v).get("reason")
            except (ValueError, AttributeError):
                continue
            if isinstance(reason, str) and reason:
                out[k[7:]] = reason
    return out


def parse_partial(m: Mapping[str, str]) -> Partial | None:
    """The streamed partial text in the session hash ``m`` (see partial.lua), if any: its
    chunks ``partial``, ``partial.1`` .. ``partial.<n - 1>`` (``partial_n`` = n) joined; a
    session saved before chunks has the whole text in ``partial``."""
    of = m.get("partial_of")
    if of is None:
        return None
    task_id, _, request_id = of.partition(" ")
    n = m.get("partial_n") or "1"
    chunks = int(n) if n.isdigit() else 1
    text = "".join([m.get("partial", ""), *(m.get(f"partial.{k}", "") for k in range(1, chunks))])
    return Partial(task_id=task_id, request_id=request_id, text=text)


def parse_receipt(stream_id: str, f: dict[str, str], role: ReceiptRole | Literal[""] = ""
                  ) -> Receipt:
    """Decode one entry of ``role``'s receipts stream (the one place receipts are decoded)."""
    return Receipt.from_stream(stream_id, f, role)


def merge_receipts(
    streams: Iterable[tuple[ReceiptRole, list[tuple[str, dict[str, str]]]]],
) -> list[Receipt]:
    """The receipts of each role's stream (``(role, XRANGE reply)``, see
    :meth:`~baton.store.keys.SessionKeys.receipt_streams`), decoded and merged in order
    (:func:`~baton.receipts.receipt_order`)."""
    merged = [parse_receipt(sid, f, role) for role, reply in streams for sid, f in reply]
    merged.sort(key=receipt_order)
    return merged


def _int(value: str | None) -> int | None:
    return int(value) if value else None


def receipts_about(
    receipts: list[Receipt], *, task_id: str | None = None, run_id: str | None = None
) -> list[Receipt]:
    """Filter a session's receipts to one task and/or one tool run."""
    if task_id is not None:
        runs = {rid for r in receipts if r.detail.task_ref == task_id
                for rid in r.detail.run_refs}
        receipts = [r for r in receipts
                    if r.detail.task_ref == task_id or _runs_of(r) & runs]
    if run_id is not None:
        receipts = [r for r in receipts if run_id in _runs_of(r)]
    return receipts


def run_ids_of(receipts: list[Receipt]) -> set[str]:
    """The ids of every tool run the receipts are about."""
    return {rid for r in receipts for rid in _runs_of(r)}


def _runs_of(r: Receipt) -> set[str]:
    """The tool runs a receipt is about: its run, the runs it dispatched, the marks it wrote."""
    return {m.run_id for m in r.marks} | set(r.detail.run_refs)


__all__ = [
    "BRAIN_RUN_FIELDS",
    "REQUEST_FIELDS",
    "Claim",
    "Decision",
    "Entries",
    "Lease",
    "Partial",
    "SessionState",
    "is_request",
    "merge_receipts",
    "parse_decisions",
    "parse_meta",
    "parse_partial",
    "parse_receipt",
    "parse_runs",
    "receipts_about",
    "run_ids_of",
    "run_status",
    "with_intents",
]
