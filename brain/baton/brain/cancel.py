"""Cancellation on the Brain: cancel intents become ``cancel_requested``; runs are stopped.

    client ── cancel.lua ──▶ inbox cancel:<task id | *>  (committed first, with a wake)
    Brain, on load ── one commit ──▶ cancel_requested on the targets (every live root task
        for "*"), the intents deleted, every live run of the targets and their descendants
        stopped: never claimed (or awaiting approval) -> completed 'cancelled' at once;
        running -> '<run>.cancel', which the attempt's next heartbeat reports to Hands
    then the handlers end the tasks: nothing more is advanced; a custom task aborts its
    children bottom-up and waits for them and its runs (brain.custom); a generation task
    waits for its runs, then ends ``cancelled`` and its submission settles ``cancelled``.

A targeted task ends ``cancelled``; the children a cancel aborts end ``aborted``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from baton.brain.context import TaskContext
from baton.models import Task, Terminal, ToolResult
from baton.store.writes import Writes, timer_member

__all__ = ["CANCELLED_BY", "REASON", "cancel_result", "close_terminal", "consume_cancels",
           "end_unrunnable", "live_runs"]

# Checkpoint data key on the tasks a cancel targeted: the reason (they end 'cancelled').
CANCELLED_BY = "_cancelled"
REASON = "cancelled by request"


def cancel_result() -> str:
    """The result of a run stopped before any worker claimed it."""
    return ToolResult(outcome="cancelled", error_code="cancelled",
                      error="cancelled before it was executed").to_json()


def live_runs(task: Task, ctx: TaskContext) -> list[str]:
    """The task's tool runs without a result yet."""
    return [rid for rid, r in ctx.state.runs.items()
            if r.intent.task_id == task.id and r.live]


async def consume_cancels(ctx: TaskContext) -> None:
    """Turn the session's cancel intents into cancel_requested, in one commit."""
    meta = ctx.state.meta
    if not meta.cancels:
        return
    tasks = ctx.state.tasks
    targets: set[str] = set()
    for c in meta.cancels:
        if c == "*":
            targets |= {t.id for t in tasks.values() if t.parent is None and not t.terminal}
        elif c in tasks and not tasks[c].terminal:
            targets.add(c)
    family = set(targets)
    grew = True
    while grew:  # the targets' descendants: their runs are stopped now too
        more = {t.id for t in tasks.values() if t.parent in family and not t.terminal}
        grew = not more <= family
        family |= more
    now = ctx.now()
    changed = []
    for tid in sorted(targets):
        t = tasks[tid]
        if t.cancel_requested:
            continue
        given = meta.cancel_reasons.get(tid) or meta.cancel_reasons.get("*")
        data = {**t.checkpoint.data, CANCELLED_BY: given or REASON}
        changed.append(t.model_copy(update={
            "cancel_requested": True, "updated_ms": now,
            "checkpoint": t.checkpoint.model_copy(update={"data": data})}))
    runs = sorted(rid for rid, r in ctx.state.runs.items()
                  if r.intent.task_id in family and r.live and r.cancel_ms is None)
    ctx.log.info("cancel_requested", targets=sorted(targets), runs=runs,
                 intents=list(meta.cancels))
    await ctx.commit(Writes(
        kind="cancel", tasks=changed, meta_del=[f"cancel:{c}" for c in meta.cancels],
        cancel_runs=runs, cancel_result=cancel_result() if runs else "",
        detail={"intents": list(meta.cancels), "targets": sorted(targets), "runs": runs}))


def close_terminal(task: Task, ctx: TaskContext, writes: Writes,
                   written: Collection[str] = ()) -> None:
    """What a task ending terminal writes besides its own state: its ended children consumed
    (but those in ``written``), its completed runs applied, and its parent left to read it
    (a child) or its waiters notified (a root)."""
    for c in ctx.state.tasks.values():
        if c.parent == task.id and c.terminal and c.id not in written:
            writes.tasks.append(c)
    writes.applied.extend(
        rid for rid, run in ctx.state.runs.items()
        if run.intent.task_id == task.id and run.status == "completed"
        and rid not in writes.applied
    )
    if task.parent is not None:
        writes.keep_live.add(task.id)  # until the parent has read it
    else:
        writes.notify.append((ctx.store.keys.settled_channel(ctx.session_id),
                              f"task:{task.id}"))


async def end_unrunnable(registry: Any, ctx: TaskContext) -> None:
    """End ``cancelled`` the tasks a cancel targeted that no handler here can run (a kind no
    Brain of this version defines: blocked) once nothing of theirs goes on (no live run, no
    live child), as their handler would: nothing is left for one to do. Without this, such a
    task would wait for a Brain that knows its kind only to be cancelled."""
    tasks = ctx.state.tasks
    ending = [t for t in tasks.values()
              if t.cancel_requested and not t.terminal and registry.get(t) is None
              and not live_runs(t, ctx)
              and not any(c.parent == t.id and not c.terminal for c in tasks.values())]
    if not ending:
        return
    now, meta = ctx.now(), ctx.state.meta
    writes = Writes(kind="final", detail={"tasks": [t.id for t in ending],
                                          "outcome": "cancelled", "reason": "blocked"})
    for t in ending:
        reason = t.checkpoint.data.get(CANCELLED_BY, REASON)
        writes.tasks.append(t.model_copy(update={
            "state": Terminal(outcome="cancelled", reason=reason), "updated_ms": now}))
        close_terminal(t, ctx, writes)
        if t.state.name == "sleeping":
            writes.timers_remove.append(
                timer_member("task", ctx.session_id, t.id, meta.wake_subject))
        if t.id in meta.blocked:
            writes.meta_del.append(f"blocked:{t.id}")
    ctx.log.info("cancelled_unrunnable", tasks=[t.id for t in ending])
    await ctx.commit(writes)
