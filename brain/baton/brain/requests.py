"""Clients' submit and start requests, taken up by the Brain.

    client ── submit.lua / start.lua ──▶ inbox submit:<request id> | start:<request id>
        (with a wake on the session's wake subject, or the requested agent's for a new one)
    Brain ── acquire.lua ──▶ a new session's meta, for the request's agent
          ── one commit ──▶ request id -> submission (or task:<request id> -> task id), the
             submission, the user entry, the task; the inbox requests deleted

The client writes only its request: the session, its entries, tasks and submissions are the
Brain's, written under its fence. The commit that writes a request's records deletes the
request, so each is taken up exactly once. A request for another agent than the session's
(possible only if a session was reopened by another agent meanwhile) is dropped.

A generation task taken up when no other one is live (it is the one to run next) is started
in the same commit: its request phase marked ``running`` under this fence and its
submission ``running``, what the generation's ``prepare`` phase would commit next (one
commit fewer per submission; a worker that dies in the model call is visible on load all
the same).
"""

from __future__ import annotations

from baton.brain import generation
from baton.brain.context import TaskContext
from baton.store.state import SessionState
from baton.store.writes import Writes

__all__ = ["consume_requests", "request_writes"]


def request_writes(state: SessionState) -> tuple[Writes, list[str], list[str]]:
    """The commit that takes up ``state``'s waiting requests: (writes, request ids taken,
    request ids dropped)."""
    writes = Writes(kind="requests", meta_del=[q.field for q in state.requests])
    taken, dropped = [], []
    for q in state.requests:
        if q.agent != state.meta.agent or q.task.id in state.tasks:
            dropped.append(q.request_id)
            continue
        if q.submission is not None and q.entry is not None:
            writes.reqs[q.request_id] = q.submission.id
            writes.submissions.append(q.submission)
            writes.entries.append(q.entry)
        else:
            writes.reqs[f"task:{q.request_id}"] = q.task.id
        writes.tasks.append(q.task)
        taken.append(q.request_id)
    writes.detail = {"requests": taken}
    return writes, taken, dropped


async def consume_requests(ctx: TaskContext) -> None:
    """Take up the submit and start requests waiting in the session's inbox, in one commit."""
    if not ctx.state.requests:
        return
    writes, taken, dropped = request_writes(ctx.state)
    _start_generation(writes, ctx)
    # Routine (nothing dropped) at DEBUG: the commit's receipt records what was taken up.
    routine = not dropped and not ctx.settings.log_each_message
    (ctx.log.debug if routine else ctx.log.info)("requests_taken_up", taken=taken,
                                                  dropped=dropped)
    await ctx.commit(writes)
    ctx.state.requests = []


def _start_generation(writes: Writes, ctx: TaskContext) -> None:
    """Start the first generation task taken up when none is live (see the module text)."""
    if any(t.kind == generation.KIND and not t.terminal for t in ctx.state.tasks.values()):
        return  # the live one runs first; the new one starts in its own turn
    new = [t for t in writes.tasks if t.kind == generation.KIND]
    if not new:
        return
    task = min(new, key=lambda t: (t.created_ms, t.id))  # the scheduler's order
    if (task.version != generation.Generation.version or task.state.name != "pending"
            or task.cancel_requested):
        return
    started = generation.started(task, ctx)
    writes.tasks = [started if t is task else t for t in writes.tasks]
    writes.submissions = [
        s.model_copy(update={"status": "running"})
        if s.id == task.submission_id and s.status == "accepted" else s
        for s in writes.submissions]
    writes.detail.update(task_id=started.id, turn=1)
