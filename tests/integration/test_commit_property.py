"""TaskContext.commit folds a write-set into the in-memory state exactly as a reload sees it.

After commit.lua succeeded, the Brain keeps working on its in-memory copy instead of reading
the session back. If the Python re-application and the script disagreed, the next phase would
decide on a state that does not exist. Hypothesis generates write-sets (entries, task
changes, tool runs, documents, submissions, approvals, cancellations, applied results,
timers, meta marks), commits them on a real redis-server and compares the in-memory state
with ``Store.load``. Each example uses a session of its own.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baton.app import App
from baton.brain.context import TaskContext
from baton.bus.subjects import BusNames
from baton.faults import Faults
from baton.models import (
    Entry,
    Pending,
    Sleeping,
    Task,
    Terminal,
    ToolIntent,
    ToolResult,
    ToolRun,
    Waiting,
)
from baton.settings import Settings
from baton.store.documents import next_change
from baton.store.state import SessionState
from baton.store.store import Store, worker_ref
from baton.store.writes import Writes, timer_member
from tests.helpers import take_up

BRAIN = worker_ref("brain", "brain-p")
HANDS = worker_ref("hands", "hands-p")
WAKE = "p.wake.notices.1"
CANCELLED = ToolResult(outcome="cancelled", error_code="cancelled", error="stopped")

texts = st.text(alphabet="abc xyz", max_size=8)
values = st.dictionaries(st.sampled_from(["a", "b", "c"]),
                         st.one_of(st.integers(-3, 3), texts), max_size=3)


@st.composite
def step(draw: st.DrawFn) -> dict[str, Any]:
    """One write-set, described abstractly; made concrete against the state it applies to."""
    return {
        "entries": draw(st.lists(texts, max_size=3)),
        "new_tasks": draw(st.lists(st.sampled_from(["pending", "sleeping", "terminal"]),
                                   max_size=2)),
        "change_tasks": draw(st.lists(st.sampled_from(["waiting", "terminal", "keep_live"]),
                                      max_size=2)),
        "runs": draw(st.lists(st.tuples(st.booleans(), st.sampled_from([None, "g1"])),
                              max_size=3)),  # (awaits approval, group)
        "complete": draw(st.integers(0, 2)),  # live runs Hands complete before this commit
        "apply": draw(st.booleans()),  # apply the completed runs
        "claim": draw(st.integers(0, 1)),  # live runs Hands claim (running) before it
        "cancel": draw(st.integers(0, 2)),
        "docs": draw(st.lists(st.tuples(st.sampled_from(["plan", "progress"]), values),
                              max_size=2, unique_by=lambda d: d[0])),
        "submission": draw(st.sampled_from([None, "running", "completed"])),
        "timers": draw(st.integers(0, 2)),
        "blocked": draw(st.sampled_from([None, "set", "clear"])),
        "deadline": draw(st.sampled_from([0, 5_000, -1])),
    }


class Session:
    """One session under a held lease, with a TaskContext the commits go through."""

    def __init__(self, store: Store, sid: str, ctx: TaskContext) -> None:
        self.store, self.sid, self.ctx = store, sid, ctx
        self.ids = itertools.count()
        # The session's submission as last written: a state holds it only while it is open
        # and its task live (see baton.store.loading)
        self.sub = next(iter(ctx.state.submissions.values()))

    @classmethod
    async def start(cls, store: Store, settings_: Settings) -> Session:
        sid = "p-" + uuid.uuid4().hex[:12]
        task = Task(id=f"{sid}-root", kind="generation", owner=sid)
        await store.inbox.submit(sid, agent="notices", compat=1, wake_subject=WAKE, request_id="r",
                                 text="hi", task=task, worker=worker_ref("client", "c"),
                                 submission_id=f"{sid}-sub")
        await take_up(store, sid, BRAIN)
        lease, state = await store.acquire_and_load(sid, BRAIN, 60_000)
        ctx = TaskContext(session_id=sid, fence=lease.fence, state=state, store=store,
                          settings=settings_, app=App({}, {}), names=BusNames(settings_.namespace),
                          worker=BRAIN, faults=Faults())
        return cls(store, sid, ctx)

    def uid(self, what: str) -> str:
        return f"{self.sid}-{what}{next(self.ids)}"

    async def hands(self, s: dict[str, Any]) -> None:
        """What Hands do between two Brain commits; the Brain then reloads (a new pass)."""
        live = [r for r in self.ctx.state.runs.values() if r.status == "dispatched"]
        for run in live[: s["complete"]]:
            claim = await self.store.runs.claim(self.sid, run.run_id, HANDS)
            result = ToolResult(outcome="ok", output={"n": 1}, attempt=claim.attempt)
            await self.store.runs.complete(self.sid, run.intent, claim.attempt, result, HANDS)
        for run in live[s["complete"]: s["complete"] + s["claim"]]:
            await self.store.runs.claim(self.sid, run.run_id, HANDS)
        self.ctx.state = await self.store.load(self.sid)

    def writes(self, s: dict[str, Any]) -> Writes:
        state, now = self.ctx.state, self.ctx.now()
        w = Writes(kind="prop", deadline_ms=s["deadline"])
        root = next(iter(state.tasks.values()), None)
        w.entries = [Entry(kind="system", text=t, ts_ms=now) for t in s["entries"]]
        for kind in s["new_tasks"]:
            state_ = {"pending": Pending(), "sleeping": Sleeping(until_ms=now + 60_000),
                      "terminal": Terminal(outcome="completed")}[kind]
            w.tasks.append(Task(id=self.uid("t"), kind="custom", owner=self.sid,
                                state=state_, created_ms=now))
        for kind, task in zip(s["change_tasks"], list(state.tasks.values()), strict=False):
            if kind == "waiting":
                w.tasks.append(task.model_copy(update={"state": Waiting(on=("x",))}))
            else:
                w.tasks.append(task.model_copy(update={"state": Terminal(outcome="completed")}))
                if kind == "keep_live":
                    w.keep_live.add(task.id)
        groups: dict[str, int] = {}
        for awaiting, group in s["runs"]:
            rid = self.uid("run")
            intent = ToolIntent(run_id=rid, session_id=self.sid, task_id=root.id if root else "",
                                tool="send_email", operation_id=f"op-{rid}", wake_subject=WAKE,
                                group=group)
            w.runs.append(intent)
            if group:
                groups[group] = groups.get(group, 0) + 1
            if awaiting:
                w.awaiting[rid] = "digest-" + rid
        w.groups = groups
        done = [r.run_id for r in state.runs.values() if r.status == "completed"]
        if s["apply"]:
            w.applied = done
        cancellable = [r.run_id for r in state.runs.values()
                       if r.status != "completed" and r.run_id not in w.applied]
        if s["cancel"] and cancellable:
            w.cancel_runs = cancellable[: s["cancel"]]
            w.cancel_result = CANCELLED.to_json()
        for name, value in s["docs"]:
            w.documents.append(next_change(state.documents.get(name), name, value, now, 3))
        if s["submission"]:
            self.sub = self.sub.model_copy(update={"status": s["submission"]})
            w.submissions.append(self.sub)
        for _ in range(s["timers"]):
            w.timers_add[timer_member("task", self.sid, self.uid("tm"), WAKE)] = now + 60_000
        if s["blocked"] == "set" and root is not None:
            w.meta_set[f"blocked:{root.id}"] = "no v2 here"
        elif s["blocked"] == "clear":
            w.meta_del.extend(f"blocked:{t}" for t in state.meta.blocked)
        return w


def _runs(runs: dict[str, ToolRun]) -> dict[str, Any]:
    """Runs without the script's clock readings (the Python side reads its own clock)."""
    return {rid: r.model_dump(exclude={"accepted_ms", "completed_ms", "heartbeat_ms",
                                       "cancel_ms", "attempts"})
            | {"cancelled": r.cancel_ms is not None, "completed": r.completed_ms is not None}
            for rid, r in runs.items()}


def _same(mem: SessionState, loaded: SessionState) -> None:
    assert mem.meta == loaded.meta
    assert mem.tasks == loaded.tasks
    assert mem.submissions == loaded.submissions
    assert mem.documents == loaded.documents
    assert _runs(mem.runs) == _runs(loaded.runs)
    assert mem.entry_count == loaded.entry_count
    tail = len(loaded.entries)
    assert list(mem.entries)[-tail:] == list(loaded.entries) if tail else True


# Function-scoped fixtures are fine here: the store is shared on purpose, and every example
# makes its own session (a fresh id), so examples never see each other's state.
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step(), min_size=1, max_size=3))
async def test_commit_reapplied_in_python_equals_a_reload(
    store: Store, settings: Settings, steps: list[dict[str, Any]]
) -> None:
    s = await Session.start(store, settings)
    for one in steps:
        await s.hands(one)
        await s.ctx.commit(s.writes(one))
        _same(s.ctx.state, await store.load(s.sid))
