"""What a task phase sees while it runs: the loaded state, the lease, and how to commit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from baton.app import Agent, App
from baton.brain.budget import ModelGate
from baton.brain.held import Holds
from baton.brain.interrupts import CancelWatch
from baton.bus.subjects import BusNames
from baton.faults import Faults
from baton.models import RunStatus, Task, ToolResult, ToolRun, WorkerRef, decode
from baton.observability.log import get_logger
from baton.settings import Settings
from baton.store.state import SessionState
from baton.store.store import Release, Store
from baton.store.writes import Writes

_LOG = get_logger("baton.brain")


@dataclass
class TaskContext:
    """One session's scheduling pass, under one lease (fence)."""

    session_id: str
    fence: int
    state: SessionState
    store: Store
    settings: Settings
    app: App
    names: BusNames
    worker: WorkerRef
    faults: Faults
    models: dict[str, Any] = field(default_factory=dict)
    log: Any = field(default_factory=lambda: _LOG)  # resolved once, not once per pass
    commits: int = 0
    # Set by the scheduler: whether nothing will be runnable once a write-set is applied,
    # i.e. its commit is the pass's last, which then releases the lease in the same script.
    idle_after: Callable[[Writes], bool] | None = None
    released_at: int = 0  # the commit (count) that released the lease, 0 if none did
    recheck: bool = False  # that commit kept the lease: work arrived meanwhile
    # Where a last commit that dispatched tool runs may hold the lease for their results
    # (brain.held); None: it always releases.
    holds: Holds | None = None
    yielded: bool = False  # a task's chain of phases yielded the pass (brain.scheduler)
    holding: bool = False  # the last commit held the lease (the pass waits, then releases)
    # The cancel requests the pass's lease renewals found waiting (brain.interrupts): a
    # long call of a task they concern stops.
    cancels: CancelWatch | None = None
    # The models' fleet-wide budgets (brain.budget); None: no model has one.
    budgets: ModelGate | None = None

    @property
    def agent(self) -> Agent:
        return self.app.agent(self.state.meta.agent)

    def retention_ms(self) -> int:
        """How long the session stays in Redis once settled: its agent's ``retention``, else
        ``session_retention_s``."""
        agent = self.app.agents.get(self.state.meta.agent)
        retention = agent.retention if agent is not None else None
        seconds = self.settings.session_retention_s if retention is None else retention
        return max(1, round(seconds * 1000))

    def live_tasks_after(self, changed: list[Task]) -> bool:
        """Whether unfinished work remains once these task changes are applied."""
        if any(not t.terminal for t in changed):
            return True
        ids = {t.id for t in changed}
        return any(not t.terminal for t in self.state.tasks.values() if t.id not in ids)

    async def commit(self, writes: Writes) -> None:
        """Commit under this pass's fence and fold the changes into the in-memory state."""
        if self.holding and self.holds is not None:
            # a commit after one that held (a sleeping task fell due meanwhile): the pass
            # goes on and releases after its last commit, so that hold is over
            self.holding = False
            self.holds.forget(self.session_id)
        if writes.deadline_ms == 0:
            live = self.live_tasks_after(writes.tasks)
            writes.deadline_ms = self.settings.progress_deadline_ms if live else -1
            if not live:  # settled: archived once its retention has passed (brain.archival)
                writes.retain_ms = self.retention_ms()
        if self.idle_after is not None and self.idle_after(writes):
            writes.release_ttl_ms = self.settings.lease_ms
            holds = self.holds
            if holds is not None and holds.can_hold() and self._awaits_results(writes):
                writes.hold_as = holds.name
                holds.expect(self.session_id)  # before the commit: a signal may beat its reply
            # (a commit that fails ends the pass, which forgets the registration)
            seq, count, outcome = await self.store.commit_and_release(
                self.session_id, self.fence, writes, self.worker)
            self.released_at = self.commits + 1
            self.recheck = outcome == Release.KEPT
            self.holding = outcome == Release.HELD
            if holds is not None and writes.hold_as and not self.holding:
                holds.forget(self.session_id)
        else:
            seq, count = await self.store.commit(self.session_id, self.fence, writes,
                                                 self.worker)
        self.commits += 1
        self._fold(writes, seq, count)

    def _awaits_results(self, writes: Writes) -> bool:
        """Whether tool runs are in flight once ``writes`` is applied: dispatched by it
        (not awaiting an approval), approved by it, or dispatched or running before."""
        if writes.approve_runs or any(r.run_id not in writes.awaiting for r in writes.runs):
            return True
        return any(run.status in ("dispatched", "running") for run in self.state.runs.values()
                   if run.intent.run_id not in writes.cancel_runs)

    def _fold(self, writes: Writes, seq: int, count: int) -> None:
        """Apply a committed write-set to ``self.state`` the way commit.lua applied it to
        Redis, so the state equals a reload (tests/integration/test_commit_property.py)."""
        st = self.state
        now = self.now()
        groups = {**st.meta.groups, **writes.groups}
        dirty = st.meta.dirty
        for t in writes.tasks:
            if writes.moves_to_done(t):
                st.tasks.pop(t.id, None)
            else:
                st.tasks[t.id] = t
        for s in writes.submissions:
            st.submissions[s.id] = s
        # A load holds the open submissions of live tasks and those live tasks name only
        # (see baton.store.loading)
        named = {t.submission_id for t in st.tasks.values()}
        for sid in [k for k, s in st.submissions.items()
                    if k not in named and (s.settled or s.task_id not in st.tasks)]:
            del st.submissions[sid]
        for d in writes.documents:
            st.documents[d.name] = d.document
        for intent in writes.runs:
            status: RunStatus = ("awaiting_approval" if intent.run_id in writes.awaiting
                                 else "dispatched")
            st.runs[intent.run_id] = ToolRun(intent=intent, status=status)
        for rid in writes.applied:
            st.runs.pop(rid, None)
        for rid in writes.cancel_runs:
            run = st.runs.get(rid)
            if run is None:
                continue
            if run.status in ("dispatched", "awaiting_approval"):  # never claimed: ended now
                st.runs[rid] = run.model_copy(update={
                    "status": "completed", "completed_ms": now, "cancel_ms": now,
                    "result": decode(ToolResult, writes.cancel_result)})
                if (g := run.intent.group) and g in groups:
                    groups[g] -= 1
                    if groups[g] <= 0:
                        del groups[g]
                dirty = True
            elif run.status == "running":  # its next heartbeat tells the attempt to stop
                st.runs[rid] = run.model_copy(update={"cancel_ms": now})
        for rid, ms in writes.approve_runs.items():
            st.runs[rid] = st.runs[rid].model_copy(
                update={"status": "dispatched", "approved_ms": ms})
        for rid, result in writes.reject_runs.items():
            run = st.runs[rid]
            st.runs[rid] = run.model_copy(update={
                "status": "completed", "completed_ms": now,
                "result": decode(ToolResult, result)})
            if (g := run.intent.group) and g in groups:
                groups[g] -= 1
                if groups[g] <= 0:
                    del groups[g]
            dirty = True
        for name in writes.meta_del:
            if name.startswith("decide:"):
                st.decisions.pop(name[7:], None)
        st.meta = st.meta.model_copy(update={"seq": seq, "groups": groups, "dirty": dirty})
        if writes.wake_subject or writes.meta_set or writes.meta_del:
            meta = st.meta
            blocked = {k: v for k, v in meta.blocked.items()
                       if f"blocked:{k}" not in writes.meta_del}
            blocked.update({k[8:]: v for k, v in writes.meta_set.items()
                            if k.startswith("blocked:")})
            cancels = tuple(c for c in meta.cancels if f"cancel:{c}" not in writes.meta_del)
            update: dict[str, Any] = {"blocked": blocked, "cancels": cancels}
            if writes.wake_subject:
                update["wake_subject"] = writes.wake_subject
            if writes.compat:
                update["compat"] = writes.compat
            st.meta = meta.model_copy(update=update)
        st.entries.extend(writes.entries)
        st.entry_count = count

    def now(self) -> int:
        """Now on Redis' clock (the one timers fire on: :class:`~baton.store.clock.
        StoreClock`), not this host's."""
        return self.store.clock.now()
