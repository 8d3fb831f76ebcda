"""The handoff timeline of a session, built from its receipts alone (``baton trace``).

Receipts are the session's commit log: every lease, commit, claim, completion and refused
write, with the writing process (role, name, pid) and its fence. That is enough to answer
"who held it, what happened to tool call 4, why did it run twice" without a tracing backend:

* a **lane** per process (a respawned worker with a new pid is a new lane);
* **events** in commit order, each with its fence (``s:N`` a Brain's session fence, ``a:N``
  a Hands attempt fence), run and task ids;
* **handoffs** between lanes: *wake* (what woke the Brain -> its lease, or the recheck of a
  Brain that held its lease for the results: a ``held`` receipt), *dispatch* (the commit
  that wrote a tool run's outbox row -> the claim of the run), *takeover* (an attempt that
  ended without a result -> its reclaim; an expired lease -> a Brain takeover);
* **wake causes**: each lease and held recheck names what woke it, read from the wake row
  its Brain was carried (the row's id names the receipt that wrote it): a completion, a
  client's submission, task start or cancel, a person's approval or rejection, a timer that
  fired, a request to restore an archived session. A Brain that carried no row (it held
  its lease, or an older Brain) answers the last such receipt its session has not taken up yet.
  A timer or a restore writes no receipt: no wake hop is timed for it;
* **slot waits**: a run of a tool capped for the fleet that waited for one of its slots
  (its Hands' ``slot_wait`` receipts: "run 1-0 waiting for a send_email slot (3 in line)",
  then "got its send_email slot after 840 ms"), with the wait's length as a hop;
* **hops** timed from commit timestamps: dispatch (intent commit -> claim), execution
  (claim -> complete of the same attempt), apply (complete -> the Brain's 'applied' mark),
  wake (the receipt that woke the Brain -> its lease); a run gated for approval is
  *awaiting approval* (no dispatch hop) until approved, then dispatched by the Brain's
  commit that carries the approval out, from which its dispatch hop runs;
* **carriers**: each message hop names the relay that published the outbox row and when,
  and the process that acted on it (read from the carrier a Brain records in its lease
  receipt and a Hands worker in its claim receipt; see :class:`baton.receipts.Carrier`);
* **publishes**: the same carriers grouped by stream message, so each relay gets a lane of
  its own with one entry per publish (a JetStream redelivery is the same stream message, so
  its second consumer hangs off the same publish) and every hop reads commit -> publish ->
  consumer, with how long the row waited in the outbox and the message in the stream;
* **model attempts**: every call of a generation task's model (the ``tools``, ``final`` and
  ``retry`` commits carry it): its request id, how it ended (answered, or the HTTP status and
  error), the wait before the next attempt, and its token usage (failed attempts included);
* what needs a person's eye: takeovers, refused stale writes, confirm outcomes, redeliveries,
  re-dispatches and re-entered phases, cancellations (the intent, then the Brain carrying it
  out), approvals and rejections (and refused approvals), compat-level migrations and
  blocked tasks.

The timeline's shape is in :mod:`baton.cli.trace.model`. Renderers:
:func:`baton.cli.trace.text.render_text` (plain text), :meth:`Trace.to_json`, and
:func:`baton.cli.trace.html.render_html` (a self-contained picture).
"""

from __future__ import annotations

from typing import Any

from baton.cli.trace.model import (
    Carried,
    Event,
    Handoff,
    Lane,
    ModelAttempt,
    Publish,
    RunHops,
    Trace,
    quarantine_line,
    row_cause,
    short_run,
    timer_kind,
)
from baton.cli.trace.steps import commit_text, gated_runs, model_attempt
from baton.cli.trace.text import render_text
from baton.receipts import (
    ApprovalDetail,
    CancelDetail,
    Carrier,
    ClaimDetail,
    CommitDetail,
    CompleteDetail,
    HeldDetail,
    LeaseDetail,
    OtherDetail,
    PartialDetail,
    Receipt,
    RefusedDetail,
    SlotWaitDetail,
    StartDetail,
    SubmitDetail,
)

__all__ = [
    "Carried", "Event", "Handoff", "Lane", "ModelAttempt", "Publish", "RunHops", "Timeline",
    "Trace", "build_trace", "quarantine_line", "render_text",
]

# ---------------------------------------------------------------------- building


def _lane_id(r: Receipt) -> str:
    """A worker's lane, under the role its receipts are attributed to (their stream's, see
    :attr:`Receipt.role`): a worker whose receipts claim another role gets a lane of its
    own, flagged, never a place in the claimed role's lane."""
    w = r.worker
    if w is None:
        return "unknown"
    return f"{r.role}:{w.name}:{w.pid}" + (f":claims-{w.role}" if r.mismatch else "")


def _fence(r: Receipt) -> str:
    d = r.detail
    if isinstance(d, ClaimDetail | CompleteDetail) or (
        isinstance(d, RefusedDetail) and d.op in ("complete", "heartbeat")
    ):
        return f"a:{r.fence}"
    if isinstance(d, LeaseDetail | HeldDetail | CommitDetail | RefusedDetail):
        return f"s:{r.fence}"
    return "-"


class Timeline:
    """Builds the trace one receipt at a time (``watch`` feeds it live; ``trace`` in bulk)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.receipts: list[Receipt] = []
        self.t0 = 0
        self.lanes: dict[str, Lane] = {}
        self.events: list[Event] = []
        self.handoffs: list[Handoff] = []
        self.runs: dict[str, RunHops] = {}
        self.claims: dict[tuple[str, int], Event] = {}  # (run, attempt) -> claim event
        self.completed: set[tuple[str, int]] = set()
        # the last receipt that asked for a wake (submit, start, complete, cancel, approve,
        # reject) not taken up yet: what a Brain carried no wake row answers
        self.waker: Event | None = None
        self.brain_last: dict[str, Event] = {}  # Brain lane -> its last event
        self.by_seq: dict[int, Event] = {}  # commit seq -> the event that wrote its rows
        # "w.<run>.<attempt>" (the last part of a Hands wake row's id) -> its completion
        self.by_wake: dict[str, Event] = {}
        self.first_task = ""  # the task of the first run seen: its runs keep short labels
        self.publishes: dict[tuple[str, str, int], Publish] = {}  # (relay, row, stream seq)
        self.model_attempts: list[ModelAttempt] = []
        self.slot_waits: dict[tuple[str, str], Event] = {}  # (run, lane) -> its wait's start

    def run(self, rid: str) -> RunHops:
        return self.runs.setdefault(rid, RunHops(run_id=rid))

    def add(self, r: Receipt) -> Event:
        """Place one receipt (the next in stream order) and return its event."""
        if not self.receipts:
            self.t0 = r.ts_ms
        i = len(self.receipts)
        self.receipts.append(r)
        lane = self._lane(r)
        d = r.detail
        ev = Event(index=i, stream_id=r.stream_id, t_ms=r.ts_ms - self.t0,
                   ts_ms=r.ts_ms, lane=lane.id, kind=r.kind, fence=_fence(r), text="",
                   seq=r.seq, run_id=str(getattr(d, "run_id", "")), task_id=d.task_ref,
                   marks=[f"{m.mark}:{m.run_id}" for m in r.marks])
        self.events.append(ev)
        if r.mismatch:  # its worker claims another role than its stream's
            ev.flags.append("role-mismatch")
        if r.foreign:  # another role's act in this role's stream: shown, never read as one
            ev.flags.append("forged")
            self._on_other(ev, d)
            ev.text = f"(a {r.kind} receipt in the {r.stream_role} receipts) {ev.text}"
            return ev
        match d:
            case SubmitDetail() | StartDetail():
                self._on_input(ev, d)
            case LeaseDetail():
                self._on_lease(ev, r, d)
            case HeldDetail():
                self._on_held(ev, d)
            case CommitDetail():
                self._on_commit(ev, r, d)
            case ClaimDetail():
                self._on_claim(ev, r, d)
            case CompleteDetail():
                self._on_complete(ev, r, d)
            case CancelDetail():
                self._on_cancel(ev, d)
            case ApprovalDetail():
                self._on_approval(ev, d)
            case RefusedDetail():
                self._on_refused(ev, r, d)
            case PartialDetail():
                ev.text = f"streamed text saved ({d.chars} chars)"
            case SlotWaitDetail():
                self._on_slot_wait(ev, d)
            case _:
                self._on_other(ev, d)
        if r.seq and not isinstance(d, RefusedDetail):
            self.by_seq.setdefault(r.seq, ev)
        if lane.role == "brain":
            self.brain_last[lane.id] = ev
        return ev

    def _short(self, run_id: str) -> str:
        if not self.first_task and run_id.count("-") >= 2:
            self.first_task = run_id.rsplit("-", 2)[0]
        return short_run(run_id, self.first_task)

    def trace(self) -> Trace:
        """The trace so far; clients, then relays, then the others in order of appearance
        (a relay between the client and the Brain/Hands lanes keeps each hop short)."""
        order = {"client": 0, "relay": 1}
        lanes = sorted(self.lanes.values(), key=lambda lane: order.get(lane.role, 2))
        return Trace(self.session_id, self.t0, lanes, self.events, self.handoffs,
                     list(self.runs.values()), list(self.publishes.values()),
                     list(self.model_attempts), first_task=self.first_task)

    def _lane(self, r: Receipt) -> Lane:
        lid = _lane_id(r)
        lane = self.lanes.get(lid)
        if lane is None:
            w = r.worker
            # A receipt whose worker claims another role than its stream's says so in its
            # lane's name (forged, or written before per-role receipts streams).
            name = (w.name + (f" [claims {w.role}, in {r.stream_role} receipts]"
                              if r.mismatch else "")) if w else "?"
            lane = self.lanes[lid] = Lane(lid, (r.role or "?") if w else "?", name,
                                          w.pid if w else 0, first_ms=r.ts_ms - self.t0)
        lane.last_ms = r.ts_ms - self.t0
        lane.events += 1
        return lane

    def _handoff(self, kind: str, src: Event, dst: Event, text: str) -> None:
        via = dst.carrier.relay if dst.carrier is not None else ""
        if via:
            text += f" (carried by {via})"
        self.handoffs.append(Handoff(kind, src.index, dst.index, dst.ts_ms - src.ts_ms, text,
                                     via=via))

    def _carried(self, ev: Event, carrier: Carrier | None, verb: str) -> Event | None:
        """Note how the message that made ``ev`` happen got there; return its source event.

        The carrier's row id names the commit that wrote the row (its seq), so the hop's
        source is exact even when several wakes are in flight.
        """
        if carrier is None:
            return None
        source = self.by_wake.get(carrier.row_id.rpartition("/")[2])
        if source is None and carrier.source_seq is not None:
            source = self.by_seq.get(carrier.source_seq)
        at = carrier.published_ms or None
        pub = self._publish(carrier, source, ev)
        ev.carrier = Carried(
            event=ev.index, consumer=self._name(ev), action=verb, relay=pub.relay,
            row_id=carrier.row_id, published_ms=carrier.published_ms,
            published_t_ms=pub.published_t_ms, stream_seq=carrier.stream_seq,
            delivery=carrier.delivery, source=pub.source, timer=carrier.timer,
            publish=pub.index, outbox_ms=pub.outbox_ms,
            transit_ms=ev.ts_ms - at if at is not None else None,
        )
        return source

    def _publish(self, carrier: Carrier, source: Event | None, ev: Event) -> Publish:
        """The publish that carried ``carrier`` (found again on a redelivery), on its relay's
        lane; the lane spans the publishes (or, when the relay gave no time, the deliveries)."""
        relay = carrier.relay or "?"
        key = (relay, carrier.row_id, carrier.stream_seq)
        pub = self.publishes.get(key)
        lane = self.lanes.get(f"relay:{relay}")
        if pub is None:
            at = carrier.published_ms - self.t0 if carrier.published_ms else None
            pub = self.publishes[key] = Publish(
                index=len(self.publishes), relay=relay, lane=f"relay:{relay}",
                row_id=carrier.row_id, stream_seq=carrier.stream_seq,
                published_ms=carrier.published_ms, published_t_ms=at,
                source=source.index if source is not None else None, timer=carrier.timer,
                outbox_ms=carrier.published_ms - source.ts_ms
                if source is not None and carrier.published_ms else None)
            when = at if at is not None else ev.t_ms
            if lane is None:
                lane = self.lanes[f"relay:{relay}"] = Lane(
                    f"relay:{relay}", "relay", relay, 0, first_ms=when, last_ms=when)
            lane.published += 1
            lane.first_ms, lane.last_ms = min(lane.first_ms, when), max(lane.last_ms, when)
        pub.deliveries.append(ev.index)
        return pub

    # one method per receipt kind

    def _on_input(self, ev: Event, d: SubmitDetail | StartDetail) -> None:
        if isinstance(d, SubmitDetail):
            ev.text = f"input requested: submission {d.submission_id or '?'}"
            self.by_wake[f"s.{d.request_id}"] = ev  # its wake row (see submit.lua)
        else:
            ev.text = f"task requested: {d.task_kind or '?'} {d.task_id}"
            self.by_wake[f"t.{d.request_id}"] = ev  # its wake row (see start.lua)
        self.waker = ev

    def _woken(self, ev: Event, w: Event | None, carrier: Carrier | None, to: str,
               relayed: bool = True) -> None:
        """Note what woke the Brain of ``ev`` (a lease or a held recheck): ``w``, the receipt
        that asked for the wake, or else the timer or restore request the wake row names;
        the wake hop runs from that receipt, never from an earlier one."""
        self.waker = None  # the pass reads the whole session: every pending cause taken up
        if w is not None:
            ev.waker, ev.woken_by = w.index, w.kind
            ev.hops["wake"] = ev.ts_ms - w.ts_ms
            ev.text += (f" (woken by {w.kind} of {self._name(w)}, wake hop {ev.hops['wake']} ms"
                        + ("" if relayed else ", no relay") + ")")
            self._handoff("wake", w, ev, f"wake: {w.kind} -> {to}, {ev.hops['wake']} ms")
            return
        cause = row_cause(carrier.row_id) if carrier is not None else ""
        ev.woken_by = cause
        if cause == "timer":
            kind = timer_kind(carrier.row_id) if carrier is not None else ""
            ev.text += f" (woken by a {kind + ' ' if kind else ''}timer that fired)"
        elif cause == "restore":
            ev.text += " (woken by a request to restore the archived session)"

    def _on_lease(self, ev: Event, r: Receipt, d: LeaseDetail) -> None:
        takeover = d.kind == "takeover"
        prev = self._brain_event(d.previous_holder, ev.lane) if takeover else None
        ev.text = "session lease taken"
        source = self._carried(ev, d.carrier, "took the lease")
        # A carried wake row names its cause exactly; only a Brain carried none (an older
        # one) is credited to the last cause waiting.
        self._woken(ev, source if d.carrier is not None else self.waker, d.carrier, "lease")
        self._describe_carrier(ev)
        if d.carrier is not None and d.carrier.delivery > 1:  # JetStream delivered it again
            ev.flags.append("redelivery")
            ev.text += f"; REDELIVERY of the wake (delivery {d.carrier.delivery})"
        if takeover:
            ev.flags.append("takeover")
            ev.text = (f"TAKEOVER of the session lease from {d.previous_holder or '?'} "
                       f"(fence {d.previous_fence} never released -> {r.fence}); " + ev.text)
            if prev is not None:
                self.lanes[prev.lane].left_lease = d.previous_fence
                self.lanes[prev.lane].taken_over_ms = max(
                    self.lanes[prev.lane].taken_over_ms, ev.t_ms)
                self._handoff("takeover", prev, ev,
                              f"takeover: {self._name(prev)} s:{d.previous_fence} -> "
                              f"{self._name(ev)} s:{r.fence}")

    def _on_held(self, ev: Event, d: HeldDetail) -> None:
        """A Brain that held its lease for tool results rechecked (baton.brain.held):
        the wake hop from the completion, with no relay in between."""
        how = ("when told (their signal, or a wake of the session joined)" if d.heard
               else f"when its hold ran out ({d.hold_ms} ms): no signal came")
        ev.text = f"lease held for the tool results: rechecked {how}"
        self._woken(ev, self.waker, None, "held lease", relayed=False)
        if not d.heard:
            ev.flags.append("retry")

    def _on_commit(self, ev: Event, r: Receipt, d: CommitDetail) -> None:
        ev.kind = f"commit:{d.step}"
        gated = gated_runs(d, r.changes)
        if d.step in ("tools", "redispatch"):
            for rid in d.runs:
                hop = self.run(rid)
                if gated == len(d.runs):  # every one waits for a person: none dispatched
                    hop.awaiting_approval = True
                elif hop.dispatched_ms is None:  # (some gated: their approvals will say)
                    hop.dispatched_ms = ev.ts_ms
        for rid in d.approved:  # the approval carried out: its outbox row written now
            hop = self.run(rid)
            hop.awaiting_approval, hop.dispatched_ms = False, ev.ts_ms
        for rid in d.rejected:
            self.run(rid).awaiting_approval = False
        w = self.waker  # a cause this commit took up wakes nothing more
        if w is not None and w.run_id and w.run_id in (
                {m.run_id for m in r.marks if m.mark == "applied"} | set(d.approved)
                | set(d.rejected)):
            self.waker = None
        ev.text, flags = commit_text(d, r.changes, self._short)
        ev.flags.extend(flags)
        if d.request_id and d.step in ("tools", "final", "retry"):
            attempt = model_attempt(ev, d)
            self.model_attempts.append(attempt)
            if d.step == "retry":
                ev.flags.append("model")
                ev.text = f"MODEL attempt failed: {attempt.describe()}"
            else:
                ev.text += f"; model {attempt.describe()}"
        applied = [m.run_id for m in r.marks if m.mark == "applied"]
        for rid in applied:
            hop = self.run(rid)
            hop.applied_ms = ev.ts_ms
            if hop.completed_ms is not None:
                ev.hops[f"apply:{rid}"] = ev.ts_ms - hop.completed_ms
        if applied:
            ev.text = f"{len(applied)} result(s) applied (mark applied)" + (
                f"; {ev.text}" if d.step not in ("apply",) else "")

    def _on_claim(self, ev: Event, r: Receipt, d: ClaimDetail) -> None:
        rid, attempt, delivery = d.run_id, d.attempt or r.fence, d.delivery
        hop = self.run(rid)
        hop.deliveries = max(hop.deliveries, delivery)
        hop.attempts.append({"attempt": attempt, "worker": self._name(ev), "lane": ev.lane,
                             "claimed_ms": ev.ts_ms, "ended_ms": None, "result": None,
                             "delivery": delivery,
                             "via": d.carrier.relay if d.carrier is not None else None})
        self.claims[(rid, attempt)] = ev
        ev.text = f"claimed {self._short(rid)} attempt {attempt}"
        if d.accepted_mark:
            ev.text += " (mark accepted)"
        if hop.dispatched_ms is not None and len(hop.attempts) == 1:
            ev.hops["dispatch"] = ev.ts_ms - hop.dispatched_ms
            ev.text += f", dispatch hop {ev.hops['dispatch']} ms"
        if delivery > 1:
            ev.flags.append("redelivery")
            ev.text += f"; REDELIVERY (delivery {delivery})"
        if d.kind == "reclaim":
            self._on_reclaim(ev, d)
        source = self._carried(ev, d.carrier, f"claimed {self._short(rid)}")
        if "dispatch" in ev.hops:
            src = source or self._dispatch_event(rid)
            if src is not None:
                self._handoff("dispatch", src, ev, f"dispatch {self._short(rid)}: "
                              f"{ev.hops['dispatch']} ms")
        self._describe_carrier(ev)

    def _describe_carrier(self, ev: Event) -> None:
        c = ev.carrier
        if c is None:
            return
        source = self.events[c.source] if c.source is not None else None
        origin = f"{source.kind} of {self._name(source)}" if source is not None else (
            row_cause(c.row_id))
        ev.text += f"; {c.describe(origin)}"

    def _on_reclaim(self, ev: Event, d: ClaimDetail) -> None:
        rid, prev = d.run_id, d.previous_attempt
        before = self.claims.get((rid, prev))
        ev.flags.append("takeover")
        redelivered = "redelivery" in ev.flags
        ev.text = (f"TAKEOVER of {self._short(rid)}: attempt {prev} by "
                   f"{d.previous_worker or '?'} ended without a result "
                   f"(status {d.previous_status}) -> attempt {d.attempt} by "
                   f"{self._name(ev)}")
        if before is not None:
            ev.text += (f" (attempt {prev} claimed at +{before.t_ms / 1000:.3f}s, "
                        f"{self._name(before)} silent since +"
                        f"{self.lanes[before.lane].last_ms / 1000:.3f}s)")
        if redelivered:
            ev.text += f"; redelivery {d.delivery}"
        if before is not None and (rid, prev) not in self.completed:
            silent = ev.t_ms - self.lanes[before.lane].last_ms
            self.lanes[before.lane].abandoned.append(f"{rid}@{prev}")
            self.lanes[before.lane].taken_over_ms = max(
                self.lanes[before.lane].taken_over_ms, ev.t_ms)
            for a in self.run(rid).attempts:
                if a["attempt"] == prev:
                    a["ended_ms"], a["result"] = ev.ts_ms, "abandoned"
            self._handoff("takeover", before, ev,
                          f"takeover {self._short(rid)}: a:{prev} {self._name(before)} -> "
                          f"a:{d.attempt} {self._name(ev)}; old lane silent "
                          f"{max(silent, 0)} ms")

    def _on_complete(self, ev: Event, r: Receipt, d: CompleteDetail) -> None:
        rid, attempt = d.run_id, r.fence
        hop = self.run(rid)
        hop.tool, hop.outcome = d.tool, d.outcome
        hop.recovery, hop.completed_ms = d.recovery, ev.ts_ms
        self.completed.add((rid, attempt))
        self.by_wake[f"w.{rid}.{attempt}"] = ev  # its wake row, if it woke the Brain
        claim = self.claims.get((rid, attempt))
        ev.text = f"completed {self._short(rid)} attempt {attempt}: {hop.outcome} (mark completed)"
        if claim is not None:  # the receipts' clock (ms steps), beside the tool's own time
            ev.hops["execution"] = ev.ts_ms - claim.ts_ms
            ev.text += (f", claim to complete {ev.hops['execution']} ms (the tool itself "
                        f"{d.duration_ms:.1f} ms)")
        for a in hop.attempts:
            if a["attempt"] == attempt:
                a["ended_ms"], a["result"] = ev.ts_ms, hop.outcome
        if hop.recovery not in ("", "none"):
            ev.flags.append("confirm" if "confirm" in hop.recovery else "recovery")
            ev.text += f"; recovery: {hop.recovery.upper()}"
        self.waker = ev

    def _on_slot_wait(self, ev: Event, d: SlotWaitDetail) -> None:
        """A run of a capped tool waits for one of its slots (or, first in line, for its
        rate), before its claim; then got it, or its Hands stopped while it waited."""
        hop = self.run(d.run_id)
        hop.tool = hop.tool or d.tool
        ev.flags.append("slot")
        run, key = self._short(d.run_id), (d.run_id, ev.lane)
        if d.state == "waiting":
            self.slot_waits[key] = ev
            what = (f"a {d.tool} slot ({d.position} in line)" if d.position
                    else f"the {d.tool} rate (first in line)")
            ev.text = f"{run} waiting for {what}"
            return
        began = self.slot_waits.pop(key, None)
        # the receipts' clock, as every hop; the Hands' own count when its first note is gone
        waited = ev.ts_ms - began.ts_ms if began is not None else d.waited_ms
        ev.hops["slot_wait"] = waited
        hop.slot_wait_ms = (hop.slot_wait_ms or 0) + waited
        if d.state == "granted":
            ev.text = f"{run} got its {d.tool} slot after waiting {waited} ms"
        else:
            ev.text = (f"{run} stopped waiting for a {d.tool} slot after {waited} ms: its "
                       "Hands stopped and handed the message back")

    def _on_cancel(self, ev: Event, d: CancelDetail) -> None:
        ev.flags.append("cancel")
        target = d.target
        ev.text = (f"CANCEL requested for {'the session' if target == '*' else 'task ' + target}"
                   f" ({d.reason})")
        # its wake row (see cancel.lua); rows written before it named the target: c.<ms>
        self.by_wake[f"c.{target}.{ev.ts_ms}"] = self.by_wake[f"c.{ev.ts_ms}"] = ev
        self.waker = ev

    def _on_approval(self, ev: Event, d: ApprovalDetail) -> None:
        """A person decided on a gated run: recorded, with a wake; the Brain it wakes
        dispatches an approved run (or ends a rejected one) in its next commit."""
        ev.flags.append("approval")
        # its wake row (see approve.lua); rows written before it named the run: d.<ms>
        self.by_wake[f"d.{d.run_id}"] = self.by_wake[f"d.{ev.ts_ms}"] = ev
        self.waker = ev
        hop = self.run(d.run_id)
        hop.tool = d.tool or hop.tool
        hop.awaiting_approval = False
        if not hop.attempts:  # a gated run among dispatched ones: not dispatched yet
            hop.dispatched_ms = None
        if d.kind == "reject":
            hop.rejected = True
            ev.text = f"REJECTED {self._short(d.run_id)}: {d.reason} (the Brain ends it next)"
            return
        hop.approved_ms = ev.ts_ms
        ev.text = (f"APPROVED {self._short(d.run_id)} (digest {d.digest[:12]}...): no longer "
                   "awaiting approval, the Brain dispatches it next")

    def _on_refused(self, ev: Event, r: Receipt, d: RefusedDetail) -> None:
        ev.flags.append("refused")
        if d.op == "approve":
            ev.text = (f"REFUSED approval of {self._short(d.run_id)}: digest "
                       f"{d.presented[:12]}... is not that of its arguments")
            return
        if d.op in ("complete", "heartbeat"):
            ev.text = (f"REFUSED stale {d.op} of {self._short(d.run_id)}: attempt "
                       f"{r.fence} presented, current {d.current} ({d.status})")
        else:
            ev.text = (f"REFUSED stale {d.op}: fence {r.fence} presented, "
                       f"current {d.current}")

    def _on_other(self, ev: Event, d: Any) -> None:
        fields = d.fields if isinstance(d, OtherDetail) else d.model_dump(exclude={"kind"})
        ev.text = ", ".join(f"{k}={v}" for k, v in fields.items())
        if isinstance(d, OtherDetail) and d.undecodable:
            ev.text = f"(undecodable: {d.undecodable}) {ev.text}"

    # lookups

    def _name(self, ev: Event) -> str:
        return self.lanes[ev.lane].name

    def _dispatch_event(self, rid: str) -> Event | None:
        for e in reversed(self.events):
            if e.kind in ("commit:tools", "commit:redispatch") and \
                    rid in self.receipts[e.index].detail.run_refs:
                return e
            if e.kind == "commit:decisions" and \
                    rid in getattr(self.receipts[e.index].detail, "approved", ()):
                return e
        return None

    def _brain_event(self, holder: str, not_lane: str) -> Event | None:
        found = [e for lid, e in self.brain_last.items()
                 if lid != not_lane and self.lanes[lid].name == holder]
        return max(found, key=lambda e: e.index) if found else None


def build_trace(session_id: str, receipts: list[Receipt],
                quarantine: dict[str, Any] | None = None, *,
                archived_ms: int | None = None) -> Trace:
    """The timeline of ``receipts`` (in stream order, as ``Store.receipts`` returns them);
    ``quarantine``: the session's poison record when it is quarantined; ``archived_ms``:
    when the session was archived, when its receipts come from the archive."""
    timeline = Timeline(session_id)
    for r in receipts:
        timeline.add(r)
    trace = timeline.trace()
    trace.quarantine = quarantine
    trace.archived_ms = archived_ms
    return trace
