"""Tool runs nothing works on: their tool message was probably lost, so it is sent again.

Shared by the generation task and custom tasks: both wait on tool runs.
"""

from __future__ import annotations

from baton.brain.context import TaskContext
from baton.models import Task, ToolRun

MAX_REDISPATCH = 3


def stuck_runs(task: Task, ctx: TaskContext, key: str = "redispatched") -> list[ToolRun]:
    """Awaited runs that nothing seems to work on: their tool message was probably lost.

    A run still ``dispatched`` (never claimed), or ``running`` with no heartbeat, for longer
    than the progress deadline gets its tool message sent again (at most MAX_REDISPATCH
    times). A duplicate is harmless: a live attempt answers busy, a finished one done.
    """
    state = task.state
    if state.name != "waiting":
        return []
    limit = ctx.settings.progress_deadline_ms
    now = ctx.now()
    sent = task.checkpoint.data.get(key, {})
    out = []
    for rid in state.on:
        run = ctx.state.runs.get(rid)
        if run is None or run.status in ("completed", "awaiting_approval") \
                or sent.get(rid, 0) >= MAX_REDISPATCH:
            continue
        last = max(run.heartbeat_ms or 0, run.intent.created_ms, sent.get(f"{rid}@", 0))
        if now - last > limit:
            out.append(run)
    return out
