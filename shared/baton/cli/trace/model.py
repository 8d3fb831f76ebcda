"""The shape of a session's handoff timeline (:mod:`baton.cli.trace` builds it from the
receipts; :func:`baton.cli.trace.text.render_text` and :mod:`baton.cli.trace.html` draw it):
lanes, events, handoffs, the hops of each tool run, the publishes and carriers of each
message hop, and the model attempts."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "Carried", "Event", "Handoff", "Lane", "ModelAttempt", "Publish", "RunHops", "Trace",
    "archived_line", "quarantine_line", "row_cause", "secs", "short_run", "timer_kind",
]


@dataclass
class Lane:
    """One process: a writer of receipts, or a relay (role "relay") seen only in carriers.

    A relay writes no receipts and its pid is not in its headers, so its lane is keyed by
    name, counts ``published`` stream messages instead of ``events``, and spans its publishes.
    """

    id: str
    role: str
    name: str
    pid: int
    first_ms: int = 0
    last_ms: int = 0
    events: int = 0
    abandoned: list[str] = field(default_factory=list)  # "run@attempt" left without a result
    left_lease: int | None = None  # a Brain's fence of the session lease it never released
    taken_over_ms: int = 0  # when another process last took over what it left (trace time)
    published: int = 0

    @property
    def label(self) -> str:
        return f"{self.name} (pid {self.pid})" if self.pid else self.name


@dataclass
class Carried:
    """One message hop: the outbox row, the relay that published it, who acted on it.

    Read from the carrier the consumer recorded in its receipt (the Brain's lease, the
    Hands' claim); ``source`` is the event whose commit wrote the row (None for a timer).
    """

    event: int  # the consuming event
    consumer: str
    action: str  # what the consumer did: "took the lease", "claimed run 3-1"
    relay: str
    row_id: str
    published_ms: int
    published_t_ms: int | None
    stream_seq: int
    delivery: int
    source: int | None
    timer: bool = False
    publish: int | None = None  # index in Trace.publishes
    outbox_ms: int | None = None  # source commit -> publish: the row's wait in the outbox
    transit_ms: int | None = None  # publish -> this consumer's receipt

    def describe(self, source: str = "") -> str:
        """``relay-1 published outbox row X at +0.012s (...) -> hands-2 claimed run 3-1``."""
        at = f" at {secs(self.published_t_ms).strip()}" if self.published_t_ms is not None \
            else ""
        origin = f" from {source}" if source else ""
        again = ": JetStream's redelivery of that publish" if self.delivery > 1 else ""
        return (f"{self.relay} published outbox row {self.row_id or '?'}{origin}{at} "
                f"(stream seq {self.stream_seq}, delivery {self.delivery}{again}) -> "
                f"{self.consumer} {self.action}")


@dataclass
class Publish:
    """One stream message a relay published: a dot on the relay's lane.

    Keyed by relay, row id and stream sequence, so every delivery of the message (the first,
    and JetStream's redeliveries after a consumer died) lists the same publish.
    """

    index: int
    relay: str
    lane: str
    row_id: str
    stream_seq: int
    published_ms: int
    published_t_ms: int | None  # None: the relay did not say when (an older relay)
    source: int | None  # the event whose commit wrote the row
    timer: bool = False
    outbox_ms: int | None = None
    deliveries: list[int] = field(default_factory=list)  # the consuming events, in order


@dataclass
class Event:
    """One receipt, placed on its lane and described."""

    index: int
    stream_id: str
    t_ms: int  # since the session's first receipt
    ts_ms: int
    lane: str
    kind: str  # the receipt kind, or the commit's step ("commit:tools")
    fence: str  # "s:3" session fence, "a:2" attempt fence, "-" none
    text: str
    seq: int = 0
    run_id: str = ""
    task_id: str = ""
    marks: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)  # takeover refused confirm redelivery ...
    hops: dict[str, int] = field(default_factory=dict)  # hop name -> ms (ending here)
    carrier: Carried | None = None  # how the message that caused it arrived (lease, claim)
    #: a lease or held recheck: what woke the Brain ("complete", "submit", "start",
    #: "approve", "reject", "cancel", "timer", "restore"; "" not known) and the event that
    #: recorded it (None for a timer or a restore, which write no receipt)
    woken_by: str = ""
    waker: int | None = None


@dataclass
class Handoff:
    """Work passing from one event to another (usually another lane)."""

    kind: str  # wake | dispatch | takeover
    src: int  # event index
    dst: int
    ms: int
    text: str
    via: str = ""  # the relay that published the message carrying it ("" when unknown)


@dataclass
class RunHops:
    """One tool run's path: dispatch, each attempt, the result, its application."""

    run_id: str
    tool: str = ""
    dispatched_ms: int | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    completed_ms: int | None = None
    applied_ms: int | None = None
    recovery: str = ""
    outcome: str = ""
    deliveries: int = 0
    #: how long it waited for a slot of its capped tool before its claim (None: no wait)
    slot_wait_ms: int | None = None
    #: gated for a person's approval (its tool declares approval) and not decided yet:
    #: not dispatched, so no dispatch hop runs while it waits
    awaiting_approval: bool = False
    approved_ms: int | None = None  # when a person approved it (its dispatch follows)
    rejected: bool = False  # a person rejected it: never dispatched

    @property
    def dispatch_hop(self) -> int | None:
        first = self.attempts[0]["claimed_ms"] if self.attempts else None
        return None if first is None or self.dispatched_ms is None else first - self.dispatched_ms

    @property
    def apply_hop(self) -> int | None:
        if self.completed_ms is None or self.applied_ms is None:
            return None
        return self.applied_ms - self.completed_ms


@dataclass
class ModelAttempt:
    """One model call of a generation task, from the commit that recorded how it ended."""

    event: int  # index of the commit event
    t_ms: int
    task_id: str
    request_id: str
    attempt: int
    status: str  # "ok", the HTTP status of a failure, or "error" (no status: a timeout, a cut)
    error: str = ""
    wait_ms: int | None = None  # the durable sleep before the next attempt (a retry)
    input_tokens: int = 0
    output_tokens: int = 0
    provider_request_id: str = ""
    outcome: str = ""  # "answered", "tool calls", "retry", "failed"

    def describe(self) -> str:
        wait = f"; retry in {self.wait_ms} ms" if self.wait_ms is not None else ""
        err = f": {self.error}" if self.error else ""
        pid = f" [{self.provider_request_id}]" if self.provider_request_id else ""
        return (f"{self.request_id} {self.status} {self.outcome}{err}{wait}; usage "
                f"{self.input_tokens} in / {self.output_tokens} out{pid}")


@dataclass
class Trace:
    session_id: str
    t0_ms: int
    lanes: list[Lane]
    events: list[Event]
    handoffs: list[Handoff]
    runs: list[RunHops]
    publishes: list[Publish] = field(default_factory=list)
    model_attempts: list[ModelAttempt] = field(default_factory=list)
    # The session's quarantine (tries, reason, quarantined_ms) when its state could not be
    # processed; no receipt records it (nothing is committed to a session that is poison).
    quarantine: dict[str, Any] | None = None
    # When the session was archived (its receipts were read from the archive), else None.
    archived_ms: int | None = None
    first_task: str = ""  # see _short: the task whose runs are labelled by their tail alone

    @property
    def duration_ms(self) -> int:
        return self.events[-1].t_ms if self.events else 0

    @property
    def lanes_by_id(self) -> dict[str, Lane]:
        return {lane.id: lane for lane in self.lanes}

    def flagged(self, flag: str) -> list[Event]:
        return [e for e in self.events if flag in e.flags]

    @property
    def carried(self) -> list[Carried]:
        """Every message hop a consumer recorded, in commit order."""
        return [e.carrier for e in self.events if e.carrier is not None]

    @property
    def relays(self) -> dict[str, int]:
        """The relays that carried this session's messages, with how many each carried."""
        out: dict[str, int] = {}
        for c in self.carried:
            out[c.relay] = out.get(c.relay, 0) + 1
        return out

    @property
    def redelivered(self) -> dict[str, int]:
        """How many of the deliveries each relay's publishes made were JetStream's
        redeliveries (a consumer died or was slow to ack): one publish, acted on again."""
        out: dict[str, int] = {}
        for c in self.carried:
            if c.delivery > 1:
                out[c.relay] = out.get(c.relay, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "t0_ms": self.t0_ms,
            "duration_ms": self.duration_ms,
            "lanes": [{**asdict(lane), "label": lane.label} for lane in self.lanes],
            "events": [asdict(e) for e in self.events],
            "handoffs": [asdict(h) for h in self.handoffs],
            "runs": [{**asdict(r), "dispatch_hop_ms": r.dispatch_hop,
                      "apply_hop_ms": r.apply_hop} for r in self.runs],
            "carriers": [asdict(c) for c in self.carried],
            "publishes": [asdict(p) for p in self.publishes],
            "model_attempts": [asdict(a) for a in self.model_attempts],
            "relays": self.relays,
            "takeovers": [e.index for e in self.flagged("takeover")],
            "refused": [e.index for e in self.flagged("refused")],
            "quarantine": self.quarantine,
            "archived": self.archived_ms is not None,
            "archived_ms": self.archived_ms,
        }


def short_run(run_id: str, first_task: str = "") -> str:
    """Run ids are ``<task>-<turn>-<n>``; the tail tells one task's runs apart on a line, and
    the runs of any task but the first one seen also show the end of their task id (two
    tasks' first runs are both ``1-0``)."""
    parts = run_id.rsplit("-", 2)
    if len(parts) != 3:
        return f"run {run_id}"
    tail = f"{parts[1]}-{parts[2]}"
    return f"run {parts[0][-6:]}/{tail}" if first_task and parts[0] != first_task else f"run {tail}"


def row_cause(row_id: str) -> str:
    """What wrote an outbox row that no receipt records: ``"timer"`` (``t/<member>/<due>``,
    fire_timers.lua), ``"restore"`` (``<session>/restore/<at>``, ask_restore.lua), else ""."""
    if row_id.startswith("t/"):
        return "timer"
    return "restore" if row_id.rsplit("/", 2)[-2:-1] == ["restore"] else ""


def timer_kind(row_id: str) -> str:
    """The kind of timer a timer row fired (its member is ``<kind>|<session>|<id>|...``)."""
    return row_id[2:].split("|", 1)[0] if row_id.startswith("t/") and "|" in row_id else ""


def quarantine_line(q: dict[str, Any] | None) -> str:
    """One line saying the session is quarantined and why (empty when it is not)."""
    if not q:
        return ""
    return (f"QUARANTINED after {q.get('tries', '?')} tries: {q.get('reason', '')} (its state "
            "could not be processed; no Brain runs it, waiting clients get QuarantinedError)")


def archived_line(archived_ms: int | None) -> str:
    """One line saying the session is archived and since when (empty when it is not)."""
    if archived_ms is None:
        return ""
    at = datetime.fromtimestamp(archived_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (f"ARCHIVED at {at}: read from the archive, as it was when it left Redis (nothing "
            "changes until a new submission restores it)")


def secs(ms: int) -> str:
    """A time since the session's first receipt: ``   +1.234s``."""
    return f"+{ms / 1000:.3f}s".rjust(9)
