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

from baton.brain.context import TaskContext
from baton.models import Task, ToolResult
from baton.store.writes import Writes

__all__ = ["CANCELLED_BY", "cancel_result", "consume_cancels", "live_runs"]

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
        data = {**t.checkpoint.data, CANCELLED_BY: REASON}
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
