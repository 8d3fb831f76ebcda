"""The invariants a chaos run checks, from committed state, receipts and the mail service,
and the run's :class:`ChaosConfig` and :class:`ChaosReport` (what it was asked to do, what
its faults did and what the checks found).

Everything here reads facts written by the system under test (never the chaos runner's own
bookkeeping, except what it did: which workers it paused, and when). Each broken invariant
becomes one line in :attr:`Findings.problems`; figures go to :attr:`Findings.counts`.

- **settled**: every submission completed; no live task or tool run left in its session.
- **exactly once**: for ``confirm`` sessions every recipient got one delivery; the mail
  service saw no repeated key, except from a worker that was SIGSTOPped while it held the
  run (a late send of a paused worker, made harmless by the key: reported, not a violation).
- **unsafe**: the non-idempotent tool never delivered twice; a run whose attempt was cut
  (claimed again while the earlier attempt was accepted but not completed) ended
  ``interrupted``.
- **fences**: no stale write was applied: Brain commits carry the fence of the newest lease
  before them; a run is completed once, by its newest claimed attempt. Refusals are counted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from baton.models import Submission, ToolRun
from baton.receipts import (
    ClaimDetail,
    CommitDetail,
    CompleteDetail,
    LeaseDetail,
    Receipt,
    RefusedDetail,
)

__all__ = ["ChaosConfig", "ChaosReport", "Findings", "SessionFacts", "check_mail", "check_session"]


@dataclass
class SessionFacts:
    """What a chaos run planned for one session and what the store says happened."""

    index: int
    session_id: str
    agent: str
    recipients: tuple[str, ...]
    unsafe: bool
    submission: Submission | None = None  # as last read; None if never accepted
    live_tasks: list[str] = field(default_factory=list)  # non-terminal tasks left
    live_runs: list[str] = field(default_factory=list)  # runs not applied
    runs: list[ToolRun] = field(default_factory=list)  # applied runs
    receipts: list[Receipt] = field(default_factory=list)
    # Archival runs: whether the session was seen archived before its second submission,
    # and whether it was restored for it (a 'restored' receipt)
    archived: bool = False
    restored: int = 0


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def add(self, problem: str) -> None:
        self.problems.append(problem)


def check_session(f: SessionFacts, deliveries: dict[str, int], out: Findings) -> None:
    """Settled, exactly once (or interrupted, for the unsafe tool), no stale write applied."""
    sid = f.session_id
    sub = f.submission
    if sub is None:
        out.add(f"{sid}: never accepted")
        return
    out.counts["settled"] += sub.settled
    if not sub.settled:
        out.add(f"{sid}: stuck ({sub.status}); live tasks {f.live_tasks}, runs {f.live_runs}")
        return
    if sub.status != "completed":
        out.add(f"{sid}: submission {sub.status}: {sub.error}")
    if f.live_tasks or f.live_runs:
        out.add(f"{sid}: settled with live tasks {f.live_tasks} / runs {f.live_runs}")
    if f.archived:  # continued after its archival: restored for it, once
        out.counts["restored"] += 1
        if f.restored < 1:
            kinds = Counter(r.kind for r in f.receipts)
            out.add(f"{sid}: continued after its archival, but no 'restored' receipt "
                    f"(its receipts: {dict(kinds)})")
    by_to = {str(r.intent.arguments.get("to")): r for r in f.runs}
    if sorted(by_to) != sorted(f.recipients) or len(f.runs) != len(f.recipients):
        out.add(f"{sid}: applied runs for {sorted(by_to)}, expected {sorted(f.recipients)}")
    claims = _claims(f.receipts)
    for to in f.recipients:
        n = deliveries.get(to, 0)
        out.counts["deliveries"] += n
        out.counts["duplicates"] += max(0, n - 1)
        run = by_to.get(to)
        outcome = run.result.outcome if run is not None and run.result else None
        if not f.unsafe:
            if n != 1:
                out.add(f"{sid}: {to} got {n} deliveries (confirm tool: exactly one expected)")
            if run is not None and outcome != "ok":
                out.add(f"{sid}: {to}: run ended {outcome} ({run.result and run.result.error})")
            if run is not None and run.result and run.result.recovery == "confirmed":
                out.counts["confirmed"] += 1
            continue
        cut = run is not None and any(
            isinstance(c.detail, ClaimDetail) and c.detail.previous_status == "accepted"
            for c in claims.get(run.run_id, ()))
        out.counts["unsafe_cut"] += cut
        out.counts["interrupted"] += outcome == "interrupted"
        if n > 1:
            out.add(f"{sid}: {to} got {n} deliveries from the unsafe tool (duplicated)")
        if cut and outcome != "interrupted":
            out.add(f"{sid}: {to}: unsafe run was cut but ended {outcome}, not interrupted")
        if outcome == "ok" and n != 1:
            out.add(f"{sid}: {to}: unsafe run ok but {n} deliveries")
    check_fences(f, out)


def _claims(receipts: list[Receipt]) -> dict[str, list[Receipt]]:
    """First claims by run id (reclaims excluded), as the Hands' receipts record them."""
    out: dict[str, list[Receipt]] = {}
    for r in receipts:
        if isinstance(r.detail, ClaimDetail) and r.detail.kind == "claim" and \
                r.role == "hands" and not r.foreign:
            out.setdefault(r.detail.run_id, []).append(r)
    return out


def check_fences(f: SessionFacts, out: Findings) -> None:
    """No write with an outdated fence was applied; refusals are counted."""
    lease_fence = 0
    attempt: dict[str, int] = {}  # run -> newest claimed attempt
    completed: Counter[str] = Counter()
    for r in f.receipts:  # in commit order (every role's stream, merged)
        role = r.role  # its stream's: only that role may write there
        d = r.detail
        if r.mismatch or r.foreign:  # every role writes its own receipts, as itself
            out.add(f"{f.session_id}: a {r.kind} receipt by "
                    f"{r.worker and f'{r.worker.role}:{r.worker.name}'} in the "
                    f"{r.stream_role} receipts")
            continue
        if isinstance(d, RefusedDetail):
            out.counts["stale_refused"] += 1
        elif isinstance(d, LeaseDetail) and role == "brain":
            lease_fence = max(lease_fence, r.fence)
        elif isinstance(d, CommitDetail) and role == "brain" and r.fence < lease_fence:
            out.add(f"{f.session_id}: Brain commit with fence {r.fence} applied after lease "
                    f"{lease_fence} ({r.worker and r.worker.name}, {d.step})")
        elif isinstance(d, ClaimDetail):
            run = d.run_id
            attempt[run] = max(attempt.get(run, 0), d.attempt or r.fence)
        elif isinstance(d, CompleteDetail):
            run = d.run_id
            completed[run] += 1
            if r.fence != attempt.get(run, 0):
                out.add(f"{f.session_id}: run {run} completed by attempt {r.fence}, newest "
                        f"claimed attempt {attempt.get(run)}")
    for run, n in completed.items():
        if n > 1:
            out.add(f"{f.session_id}: run {run} completed {n} times")


def check_mail(stats: dict[str, Any], facts: list[SessionFacts],
               paused: set[str], out: Findings) -> None:
    """Repeated keys are raw re-sends; only a worker that was paused may have made one.

    ``paused``: the names of the workers SIGSTOPped during the run. A paused Hands that
    claimed a run and had not sent yet sends late when it resumes, after another replica
    confirmed and sent: the key makes that harmless, and it is not a re-send after a kill.
    """
    runs = {r.intent.operation_id: (f, r) for f in facts for r in f.runs}
    for key, repeats in (stats.get("repeated_keys") or {}).items():
        out.counts["raw_resends"] += int(repeats)
        found = runs.get(key)
        if found is None:
            out.add(f"mail key {key} repeated {repeats}x, not the operation of any run")
            continue
        f, run = found
        holders = {c.worker.name for c in _claims(f.receipts).get(run.run_id, []) if c.worker}
        if any(name in paused for name in holders):
            out.counts["raw_resends_by_paused"] += int(repeats)
            continue
        out.add(f"{f.session_id}: operation {key} sent raw {repeats + 1}x (claimed by "
                f"{sorted(holders)}, none of them paused): a re-send after a kill")


@dataclass(frozen=True)
class ChaosConfig:
    """What a chaos run does (``baton chaos`` options, :mod:`baton.devkit.chaos`)."""

    sessions: int = 50
    brains: int = 2
    hands: int = 2
    relays: int = 2
    kill_every: float = 2.0  # 0: no kills
    pause_every: float = 0.0  # 0: no pauses
    restart_redis: int = 0
    restart_nats: int = 0
    unsafe_share: float = 0.2
    seed: int = 1
    rate: float = 10.0  # sessions submitted per second
    mail_delay_ms: int = 30  # widens the "accepted, reply not yet seen" window
    deadline: float = 600.0
    cpu_hogs: int = 0  # busy processes beside the stack: a starved machine
    cluster: bool = False  # Redis Cluster (3 primaries x 2 replicas), 3 NATS nodes: not one each
    partitions: int = 0  # network partitions (needs cluster, root)
    reshard: int = 0  # shard slots moved to another primary, key by key (needs cluster)
    # Archival (--archive S): sessions settle, stay S seconds in Redis and are archived while
    # the faults go on; this share of them is then continued by a second submission (to five
    # recipients more), which restores the session first. 0 seconds: no archival.
    archive_s: float = 0.0
    restore_share: float = 0.3


@dataclass
class ChaosReport:
    """What a chaos run did (its faults, counted by :class:`~baton.devkit.chaos.faults.ChaosFaults`)
    and found (:attr:`findings`)."""

    config: ChaosConfig
    sessions: int = 0
    settled: int = 0
    kills: Counter[str] = field(default_factory=Counter)  # by role
    pauses: int = 0
    restarts: Counter[str] = field(default_factory=Counter)  # redis / nats
    partitions: Counter[str] = field(default_factory=Counter)  # by kind (PARTITION_KINDS)
    crashes: dict[str, int] = field(default_factory=dict)  # exits nobody caused, by process
    crash_logs: dict[str, str] = field(default_factory=dict)
    start_failures: dict[str, int] = field(default_factory=dict)  # started while a server was down
    findings: Findings = field(default_factory=Findings)
    mail: dict[str, Any] = field(default_factory=dict)
    probes: int = 0  # sessions run after the checks to see idle survivors of a Redis restart
    seconds: float = 0.0
    error: str = ""

    @property
    def violations(self) -> list[str]:
        return [*([self.error] if self.error else []), *self.findings.problems]

    def summary(self) -> dict[str, Any]:
        c = self.findings.counts
        return {
            "sessions": self.sessions, "settled": self.settled,
            "kills": sum(self.kills.values()), "pauses": self.pauses,
            "restarts": {"redis": self.restarts["redis"], "nats": self.restarts["nats"]},
            "slot_moves": self.restarts["reshard"],
            "partitions": dict(self.partitions), "cluster": self.config.cluster,
            "deliveries": c["deliveries"], "duplicates": c["duplicates"],
            "raw_resends": c["raw_resends"] - c["raw_resends_by_paused"],
            "late_sends_by_paused": c["raw_resends_by_paused"],
            "stale_refused": c["stale_refused"], "confirmed": c["confirmed"],
            "interrupted": c["interrupted"], "crashes": sum(self.crashes.values()),
            "start_failures": sum(self.start_failures.values()),
            "violations": len(self.violations), "problems": self.violations[:10],
            "seed": self.config.seed, "cpu_hogs": self.config.cpu_hogs,
            "recovery_probes": self.probes,
            "archived_and_restored": c["restored"],
            "late_for_archived": c["late_for_archived"],
            "seconds": round(self.seconds, 1),
        }
