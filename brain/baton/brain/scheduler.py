"""The scheduler of one session pass: advance every runnable task until none is.

First the pass settles what the session's state asks of this Brain before any phase runs
(brain.versions, brain.cancel): a session at a level this Brain does not serve is left
alone; one at an older level it migrates from is migrated; cancel intents become
``cancel_requested``; tasks nothing here can run are reported blocked.

Each round looks at the live tasks, oldest first, and asks each one's handler (found in the
registry by kind and version) whether it can run. Custom tasks about to run a phase are first
marked ``running`` under the pass's fence, all of them in ONE commit (a worker that dies in
any of those phases is then visible on load; marked together, they are ``shared`` suspects
that re-run one by one); then each runnable task advances until it waits, sleeps or ends.
A round that committed nothing ends the pass.

A task that goes from phase to phase without waiting (``Step.goto``) yields the pass after
:data:`CHAIN_PHASES` phases or :data:`CHAIN_S` seconds (``ctx.yielded``): the pass loads the
session again under its lease and starts over, so what arrived meanwhile (a cancel, a
message, a decision) is taken up; a task that loops on goto never starves them.

The pass's last commit releases the lease in the same script (no release round trip): before
each commit the scheduler tells whether anything would be runnable once its write-set is
applied (:func:`_idle_after`, the same test the next round makes). If a later commit comes
all the same (a sleeping task fell due meanwhile), it is still fenced, and the pass releases
again after it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import structlog

from baton.brain.cancel import consume_cancels, end_unrunnable
from baton.brain.context import TaskContext
from baton.brain.decisions import consume_decisions
from baton.brain.registry import Registry
from baton.brain.requests import consume_requests
from baton.brain.versions import migrate_session, note_blocked, unserved
from baton.models import Task
from baton.observability.log import bounded
from baton.observability.spans import SESSION, enter_span, recording_tracer
from baton.store.state import Entries
from baton.store.writes import Writes

__all__ = ["CHAIN_PHASES", "CHAIN_S", "advance", "schedule"]

CHAIN_PHASES = 64
CHAIN_S = 0.25


async def advance(handler: Any, task: Any, ctx: Any) -> Any:
    """One step of a task (the scheduler's call of ``handler.advance``): a span per phase,
    and the task and phase bound to every log line meanwhile."""
    phase = task.checkpoint.phase
    # bind, then reset to what was bound before: structlog's bound_contextvars() does the
    # same after reading every context variable of the context, at every phase.
    tokens = structlog.contextvars.bind_contextvars(task_id=task.id, phase=phase)
    try:
        t = recording_tracer()
        if t is None:
            return await handler.advance(task, ctx)
        with enter_span(t, f"phase {task.kind}.{phase}", **{
            SESSION: ctx.session_id, "baton.task_id": task.id, "baton.task.kind": task.kind,
            "baton.task.state": task.state.name, "baton.fence": ctx.fence,
        }):
            return await handler.advance(task, ctx)
    finally:
        structlog.contextvars.reset_contextvars(**tokens)


async def schedule(registry: Registry, ctx: TaskContext) -> None:
    """Advance every runnable task of the session until nothing is runnable."""
    if reason := unserved(ctx.app, ctx.state.meta):
        ctx.log.warning("session_not_served", reason=bounded(reason))
        return
    await consume_requests(ctx)
    await migrate_session(registry, ctx)
    await consume_cancels(ctx)
    await end_unrunnable(registry, ctx)
    await consume_decisions(ctx)
    await note_blocked(registry, ctx)
    ctx.idle_after = lambda writes: _idle_after(registry, ctx, writes)
    progressed = True
    while progressed:
        progressed = False
        runnable = [(t, h) for t in _ordered(ctx)
                    if (h := registry.get(t)) is not None and h.runnable(t, ctx)]
        await _mark_running(runnable, ctx)
        for task, handler in runnable:
            current: Task | None = ctx.state.tasks.get(task.id)
            if current is None or not handler.runnable(current, ctx):
                continue  # changed by an earlier task of this round (e.g. aborted)
            before = ctx.commits
            chain, since = 0, time.monotonic()
            while current is not None:
                current = await advance(handler, current, ctx)  # a span per phase
                chain += 1
                if current is not None and (chain >= CHAIN_PHASES
                                            or time.monotonic() - since >= CHAIN_S):
                    ctx.yielded = True  # still running, under the lease: recheck
                    return
            progressed = progressed or ctx.commits > before


async def _mark_running(runnable: list[tuple[Task, Any]], ctx: TaskContext) -> None:
    marked = [m for t, h in runnable if hasattr(h, "mark") and (m := h.mark(t, ctx)) is not None]
    if not marked:
        return
    detail: dict[str, Any] = {"tasks": [t.id for t in marked]}
    if len(marked) == 1:
        detail.update(task_id=marked[0].id, phase=marked[0].checkpoint.phase)
    else:  # a death during any of these phases is not blamed on one task (brain.custom)
        marked = [t.model_copy(update={"state": t.state.model_copy(update={"shared": True})})
                  for t in marked]
    timers = [_sleep_timer(t, ctx) for t, _ in runnable
              if t.state.name == "sleeping" and any(m.id == t.id for m in marked)]
    await ctx.commit(Writes(kind="run", tasks=marked, timers_remove=timers, detail=detail))


def _sleep_timer(task: Task, ctx: TaskContext) -> str:
    from baton.store.writes import timer_member

    return timer_member("task", ctx.session_id, task.id, ctx.state.meta.wake_subject)


def _idle_after(registry: Registry, ctx: TaskContext, writes: Writes) -> bool:
    """Whether no task would be runnable once ``writes`` is committed: folded into a copy of
    the pass's state (the commit may still fail), then the next round's test."""
    if any(t.state.name in ("pending", "running") for t in writes.tasks):
        return False  # a task left to run at once (every handler runs those): no probe
    st = ctx.state
    probe = dataclasses.replace(ctx, state=dataclasses.replace(
        st, tasks=dict(st.tasks), documents=dict(st.documents),
        submissions=dict(st.submissions), runs=dict(st.runs), decisions=dict(st.decisions),
        entries=Entries(), requests=[]), idle_after=None)
    probe._fold(writes, st.meta.seq + 1, st.entry_count + len(writes.entries))
    return not any(h.runnable(t, probe) for t in _ordered(probe)
                   if (h := registry.get(t)) is not None)


def _ordered(ctx: TaskContext) -> list[Task]:
    """Live tasks, oldest first; only the oldest generation task of a session runs."""
    tasks = sorted(ctx.state.tasks.values(), key=lambda t: (t.created_ms, t.id))
    out, seen_generation = [], False
    for t in tasks:
        if t.kind == "generation":
            if seen_generation:
                continue
            seen_generation = True
        out.append(t)
    return out
