"""Versions on the Brain: which sessions it may run, taking over older ones, blocked tasks.

* A session records its agent and compat level; its wakes go to ``<ns>.wake.<agent>.<compat>``.
  A Brain consumes its agent's own level and the levels it ``migrates_from``
  (:attr:`baton.app.Agent.levels`). A session at any other level (e.g. a newer one reached
  through a stale wake) is left untouched.
* The first pass of a newer Brain over a session at an older level migrates it in ONE
  commit: custom tasks whose definition has a newer version go through its
  ``migrate(task) -> task``, sleeping tasks' timers and the session's wake subject (and its
  deadline) move to the new level, and ``compat`` records it.
* A live task that no definition here can run (unknown kind, a version newer than this
  Brain knows, or older without a migrate) is **blocked**, never failed: its reason is
  committed as meta ``blocked:<task id>`` (shown by ``inspect``), the session's deadline
  stays armed, and the mark is cleared once a Brain that can run it looks again.
"""

from __future__ import annotations

from typing import Any

from baton.app import App
from baton.brain.context import TaskContext
from baton.brain.registry import Registry
from baton.models import SessionMeta, Task
from baton.observability.log import error_text
from baton.store.writes import Writes, timer_member

__all__ = ["blocked_reason", "migrate_session", "note_blocked", "unserved"]


def unserved(app: App, meta: SessionMeta) -> str:
    """Why this Brain must not run the session ("" when it may)."""
    agent = app.agents.get(meta.agent)
    if agent is None:
        return f"this Brain's app declares no agent {meta.agent!r}"
    if meta.compat in agent.levels:
        return ""
    return (f"session {meta.session_id} is at compat {meta.compat}; this Brain runs "
            f"{agent.name} at {agent.compat} and migrates from {list(agent.migrates_from)}")


def blocked_reason(registry: Registry, task: Task, worker: str) -> str:
    """Why no definition here can run ``task`` (it has none)."""
    known = registry.kinds().get(task.kind)
    if not known:
        return f"no definition of task kind {task.kind!r} on {worker}"
    if task.version > max(known):
        return (f"task {task.kind} v{task.version} is newer than {worker} knows "
                f"(v{max(known)})")
    return (f"task {task.kind} v{task.version}: {worker} has v{known} without a migrate "
            "from it")


async def migrate_session(registry: Registry, ctx: TaskContext) -> None:
    """Move a session from an older compat level to this Brain's agent level."""
    meta, agent = ctx.state.meta, ctx.agent
    if meta.compat == agent.compat:
        return
    subject = ctx.names.wake_subject(agent.name, agent.compat)
    writes = Writes(kind="migrate", wake_subject=subject, compat=agent.compat)
    migrated: dict[str, Any] = {}
    for task in ctx.state.tasks.values():
        if task.terminal or task.kind == "generation":
            continue
        defn = registry.definition(task.kind)
        if defn is not None and defn.version > task.version and defn.migrate is not None:
            try:
                new = defn.migrate(task).model_copy(update={"version": defn.version})
            except Exception as exc:  # the app's code: the task stays, blocked by its version
                ctx.log.error("task_migration_failed", task_id=task.id, error=error_text(exc))
                writes.meta_set[f"blocked:{task.id}"] = (
                    f"migrate v{task.version} -> v{defn.version} failed: {exc!r}"[:500])
                continue
            writes.tasks.append(new)
            migrated[task.id] = [task.version, defn.version]
            task = new
        if task.state.name == "sleeping":  # its timer fires on the new level's subject
            writes.timers_remove.append(timer_member("task", ctx.session_id, task.id,
                                                     meta.wake_subject))
            writes.timers_add[timer_member("task", ctx.session_id, task.id, subject)] = \
                task.state.until_ms
    writes.detail = {"from": meta.compat, "to": agent.compat, "wake_subject": subject,
                     "migrated": migrated}
    ctx.log.info("session_migrated", compat_from=meta.compat, compat_to=agent.compat,
                 tasks=migrated)
    await ctx.commit(writes)


async def note_blocked(registry: Registry, ctx: TaskContext) -> None:
    """Commit the reasons of tasks nothing here can run; clear marks no longer true."""
    blocked = {t.id: blocked_reason(registry, t, ctx.worker.name)
               for t in ctx.state.tasks.values()
               if not t.terminal and registry.get(t) is None}
    meta = ctx.state.meta
    # A mark stays while its task is blocked; another Brain's words for it are not news.
    new = {f"blocked:{k}": v for k, v in blocked.items() if k not in meta.blocked}
    gone = [f"blocked:{k}" for k in meta.blocked if k not in blocked]
    if not new and not gone:
        return
    if new:
        ctx.log.warning("tasks_blocked", blocked=blocked)
    await ctx.commit(Writes(kind="blocked", meta_set=new, meta_del=gone, detail={
        "blocked": {k[8:]: v for k, v in new.items()}, "cleared": [k[8:] for k in gone]}))
