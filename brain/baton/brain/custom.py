"""The handler of custom tasks: phases as durable states, children, waits, sleeps, aborts.

    pending ─┐                       ┌─ goto ──▶ running@next (committed, runs at once)
    waiting ─┼─▶ running@phase ─run─▶┼─ wait ──▶ waiting{on, policy}@then
    sleeping ┘   (marked first)      ├─ sleep ─▶ sleeping{until}@then + durable timer
                                     └─ complete | fail ─▶ terminal, or completing{outcome}
                                                           while owned children are live

* A phase runs only once its task is durably ``running`` under this Brain's fence, so a
  worker that dies inside it leaves a ``running`` task under an old fence: the next Brain
  counts it in ``task.crashes`` and runs the phase again, and at ``settings.restart_limit``
  ends the task ``failed`` with the reason. A phase that raises counts the same way; one a
  stopping Brain handed over (meta ``handed``, release.lua) is run again uncounted.
* A terminal child stays in the live set until its parent consumed it (read its result, or
  ended itself); a root task leaves it at once.
* ``cancel_requested`` ends a task at its next scheduling, bottom-up: it first asks its
  live children to abort and its live tool runs to stop, and stays ``completing`` until they
  have ended. A task a cancel targeted ends ``cancelled`` (brain.cancel), the children it
  aborts ``aborted``. Any task ending other than ``completed`` stops its live runs the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baton.brain.cancel import CANCELLED_BY, cancel_result, close_terminal, live_runs
from baton.brain.context import TaskContext
from baton.brain.phases import PRIVATE, PhaseContext, dispatch_row
from baton.brain.redispatch import stuck_runs
from baton.errors import ConfigError, ConflictError, CorruptStateError, ValidationError
from baton.models import (
    Checkpoint,
    Completing,
    Running,
    Sleeping,
    Task,
    Terminal,
    Waiting,
)
from baton.store.writes import Writes, timer_member

if TYPE_CHECKING:
    from baton.brain.registry import Registry
    from baton.brain.tasks import Step, TaskDef

__all__ = ["CustomTask"]

REDISPATCHED = PRIVATE + "redispatched"
# Errors of a phase's own making (bad step, invalid document, unknown tool ...) that the
# commit refuses: counted like a crash instead of retrying the wake forever.
PHASE_ERRORS = (ConfigError, ValidationError, ConflictError)


class CustomTask:
    """Runs the tasks of one :class:`TaskDef` (one kind, one version)."""

    def __init__(self, defn: TaskDef, registry: Registry) -> None:
        self.defn = defn
        self.kind = defn.kind
        self.version = defn.version
        self.registry = registry

    # ------------------------------------------------------------------ scheduling

    def runnable(self, task: Task, ctx: TaskContext) -> bool:
        state = task.state
        if state.name == "terminal":
            return False
        if state.name == "completing":
            return not live_children(task, ctx) and not (
                state.outcome != "completed" and live_runs(task, ctx))
        if task.cancel_requested or state.name in ("pending", "running"):
            return True
        if state.name == "waiting":
            return wait_over(state, ctx) or bool(self._stuck(task, ctx))
        if state.name == "sleeping":
            return state.until_ms <= ctx.now()
        return False

    def mark(self, task: Task, ctx: TaskContext) -> Task | None:
        """The task marked ``running`` for its next phase, to commit before the phase runs.

        None when there is nothing to mark: the task is ours already, is ending, or must be
        handled on its own (a re-entered task at the restart limit, stuck tool runs).
        """
        state = task.state
        if task.cancel_requested or state.name in ("terminal", "completing"):
            return None
        if state.name == "running":
            return None  # ours, or re-entered on its own (advance) so a crash is its own
        if state.name == "waiting" and not wait_over(state, ctx):
            return None  # woken for its stuck runs only
        if state.name == "pending":
            task = task.model_copy(update={"checkpoint": Checkpoint(phase=self.defn.start)})
        return self._running(self._migrated(task), ctx, crashes=task.crashes)

    async def advance(self, task: Task, ctx: TaskContext) -> Task | None:
        """Take the task one step; the task again if it can go on at once, else None."""
        state = task.state
        if state.name == "completing":
            await self._finish(task, ctx, state.outcome, task.result, state.reason)
            return None
        if task.cancel_requested:
            await self._abort(task, ctx)
            return None
        if state.name == "waiting" and not wait_over(state, ctx):
            await self._redispatch(task, ctx)
            return None
        if state.name == "running" and state.fence != ctx.fence:
            # A worker died while this task was running. Marked alone, it was the task in
            # its phase: count it. Marked with others, it may not have started: run it
            # alone now, so that a phase that kills its worker is found and counted. A
            # worker that stopped in it and handed the session over (release.lua) did not
            # die: not counted.
            handed = ctx.state.meta.handed_over(state.fence)
            crashes = task.crashes if state.shared or handed else task.crashes + 1
            (ctx.log.info if handed else ctx.log.warning)(
                "phase_handed_over" if handed else "phase_reentered", task_id=task.id,
                phase=task.checkpoint.phase, crashes=crashes, previous_worker=state.worker,
                shared=state.shared)
            if crashes >= ctx.settings.restart_limit:
                reason = (f"restart limit: a worker died {crashes} times in phase "
                          f"{task.checkpoint.phase}")
                await self._finish(task.model_copy(update={"crashes": crashes}), ctx,
                                   "failed", None, reason)
                return None
            marked = self._running(task, ctx, crashes=crashes)
        elif state.name != "running":
            fallback = self.mark(task, ctx)  # the scheduler marks in batches; this is a fallback
            if fallback is None:
                return None
            marked = fallback
        else:
            return await self._run_phase(task, ctx)
        detail: dict[str, Any] = {"task_id": task.id, "phase": marked.checkpoint.phase}
        if state.name == "running":
            detail["reentered"] = {task.id: crashes}
        await ctx.commit(Writes(kind="run", tasks=[marked], detail=detail))
        return await self._run_phase(marked, ctx)

    # ------------------------------------------------------------------ one phase

    async def _run_phase(self, task: Task, ctx: TaskContext) -> Task | None:
        phase = task.checkpoint.phase
        fn = self.defn.phases.get(phase)
        if fn is None:
            await self._finish(task, ctx, "failed", None,
                               f"task {self.kind} v{self.version} has no phase {phase!r}")
            return None
        pc = PhaseContext(task, ctx, self.registry)
        ctx.faults.hit("brain.in_phase")
        try:
            step = await fn(task, pc)
            return await self._apply(task, ctx, pc, step)
        except CorruptStateError:  # the session's stored state: quarantined, not retried
            raise
        except PHASE_ERRORS as exc:
            return await self._phase_failed(task, ctx, exc)
        except Exception as exc:  # the app's code: never let it take the Brain down
            return await self._phase_failed(task, ctx, exc)

    async def _phase_failed(self, task: Task, ctx: TaskContext, exc: Exception) -> Task | None:
        crashes = task.crashes + 1
        phase = task.checkpoint.phase
        error = f"{type(exc).__name__}: {exc}"
        ctx.log.warning("phase_failed", task_id=task.id, phase=phase, crashes=crashes,
                        error=error)
        if crashes >= ctx.settings.restart_limit:
            reason = f"restart limit: phase {phase} failed {crashes} times; last: {error}"
            await self._finish(task.model_copy(update={"crashes": crashes}), ctx, "failed",
                               None, reason)
            return None
        task = self._running(task, ctx, crashes=crashes)
        await ctx.commit(Writes(kind="phase_failed", tasks=[task], detail={
            "task_id": task.id, "phase": phase, "crashes": crashes, "error": error[:500]}))
        return task  # runs again at once, up to the limit

    async def _apply(
        self, task: Task, ctx: TaskContext, pc: PhaseContext, step: Step
    ) -> Task | None:
        from baton.brain.tasks import Step

        if not isinstance(step, Step):
            raise ConfigError(f"phase {task.checkpoint.phase} returned {step!r}, not a Step")
        writes = pc.writes(f"phase:{task.checkpoint.phase}")
        writes.detail = {"task_id": task.id, "phase": task.checkpoint.phase, "step": step.kind}
        if pc.runs:
            writes.detail["runs"] = [r.run_id for r in pc.runs]
        if step.kind in ("complete", "fail"):
            outcome = "completed" if step.kind == "complete" else "failed"
            await self._finish(task, ctx, outcome, step.result, step.reason, writes)
            return None
        if step.phase not in self.defn.phases:
            raise ConfigError(f"step {step.kind} to unknown phase {step.phase!r}")
        if private := sorted(k for k in pc.data if k.startswith(PRIVATE)):
            raise ConfigError(f"phase {task.checkpoint.phase} set ctx.data keys starting with "
                              f"{PRIVATE!r}, which are Baton's own: rename {', '.join(private)}")
        data = {**pc.data, **step.data}
        checkpoint = Checkpoint(phase=step.phase, data=data, step=task.checkpoint.step + 1)
        now = ctx.now()
        update: dict[str, Any] = {"checkpoint": checkpoint, "crashes": 0, "updated_ms": now}
        if step.kind == "goto":
            update["state"] = Running(worker=ctx.worker.name, fence=ctx.fence, since_ms=now)
        elif step.kind == "wait":
            self._check_awaited(task, ctx, pc, step.ids)
            update["state"] = Waiting(on=step.ids, policy=step.policy)
        else:
            until = step.until_ms if step.until_ms is not None else now + int(
                (step.seconds or 0) * 1000)
            update["state"] = Sleeping(until_ms=until)
            writes.timers_add[self._timer(task, ctx)] = until
        nxt = task.model_copy(update=update)
        writes.tasks.append(nxt)
        await ctx.commit(writes)
        return nxt if step.kind == "goto" else None

    def _check_awaited(
        self, task: Task, ctx: TaskContext, pc: PhaseContext, ids: tuple[str, ...]
    ) -> None:
        """A wait is for this task's own children and tool runs: an id that is neither would
        be taken as settled, and the next phase would run at once without its result.

        Known ids must belong to the task. An id no longer in the session's state (a result
        read by an earlier phase) must at least have the form of one: a run id derived from
        the task's id, or a child id of a declared task kind."""
        staged = {c.id for c in pc.children} | {r.run_id for r in pc.runs}
        for i in ids:
            if i in staged:
                continue
            child, run = ctx.state.tasks.get(i), ctx.state.runs.get(i)
            if child is not None:
                ours = child.parent == task.id
            elif run is not None:
                ours = run.intent.task_id == task.id
            else:
                ours = i.startswith(f"{task.id}-") or self._child_form(i)
            if not ours:
                raise ConfigError(
                    f"Step.wait on {i!r}: not a child task or tool run of task {task.id} "
                    f"(wait on the ids ctx.spawn and ctx.call_tool returned)")

    def _child_form(self, i: str) -> bool:
        kind, _, digest = i.rpartition("-")
        return (len(digest) == 16 and all(c in "0123456789abcdef" for c in digest)
                and self.registry.definition(kind) is not None)

    # ------------------------------------------------------------------ endings

    async def _finish(
        self, task: Task, ctx: TaskContext, outcome: Any, result: Any, reason: str,
        writes: Writes | None = None,
    ) -> None:
        """Decide the task's outcome: terminal, or completing while owned children live."""
        writes = writes or Writes(kind="final")
        written = {t.id: t for t in writes.tasks}
        live = [c for c in live_children(task, ctx) if c.id not in written]
        live += [t for t in written.values() if t.parent == task.id and not t.terminal]
        # A task ending other than completed stops its runs and waits until they ended.
        runs = live_runs(task, ctx) if outcome != "completed" else []
        now = ctx.now()
        if live or runs:
            state: Any = Completing(outcome=outcome, reason=reason)
            if outcome != "completed":  # a failed or aborted parent aborts what it owns
                for c in live:
                    if not c.cancel_requested:
                        writes.tasks = [t for t in writes.tasks if t.id != c.id]
                        writes.tasks.append(c.model_copy(update={"cancel_requested": True}))
            stop = [r for r in runs if ctx.state.runs[r].cancel_ms is None]
            if stop:
                writes.cancel_runs.extend(stop)
                writes.cancel_result = cancel_result()
        else:
            state = Terminal(outcome=outcome, reason=reason)
            close_terminal(task, ctx, writes, written)
        if task.state.name == "sleeping":
            writes.timers_remove.append(self._timer(task, ctx))
        done = task.model_copy(update={"state": state, "result": result, "updated_ms": now})
        writes.tasks.append(done)
        writes.kind = writes.kind if writes.kind.startswith("phase:") else "final"
        writes.detail = {**writes.detail, "task_id": task.id, "outcome": outcome,
                         "state": state.name}
        if reason:
            writes.detail["reason"] = reason
        await ctx.commit(writes)

    async def _abort(self, task: Task, ctx: TaskContext) -> None:
        by = task.checkpoint.data.get(CANCELLED_BY)  # targeted by a cancel, or aborted
        await self._finish(task, ctx, "cancelled" if by else "aborted", task.result,
                           by or "cancelled")

    # ------------------------------------------------------------------ helpers

    def _running(self, task: Task, ctx: TaskContext, crashes: int) -> Task:
        now = ctx.now()
        return task.model_copy(update={
            "state": Running(worker=ctx.worker.name, fence=ctx.fence, since_ms=now),
            "crashes": crashes, "updated_ms": now,
        })

    def _migrated(self, task: Task) -> Task:
        if task.version == self.version or self.defn.migrate is None:
            return task
        migrated = self.defn.migrate(task)
        return migrated.model_copy(update={"version": self.version})

    def _timer(self, task: Task, ctx: TaskContext) -> str:
        return timer_member("task", ctx.session_id, task.id, ctx.state.meta.wake_subject)

    def _stuck(self, task: Task, ctx: TaskContext) -> list[str]:
        """Awaited runs nothing seems to work on (their tool message was probably lost)."""
        return [r.run_id for r in stuck_runs(task, ctx, key=REDISPATCHED)]

    async def _redispatch(self, task: Task, ctx: TaskContext) -> None:
        stuck = self._stuck(task, ctx)
        if not stuck:
            return
        sent = dict(task.checkpoint.data.get(REDISPATCHED, {}))
        for rid in stuck:
            sent[rid] = sent.get(rid, 0) + 1
            sent[f"{rid}@"] = ctx.now()
        checkpoint = task.checkpoint.model_copy(
            update={"data": {**task.checkpoint.data, REDISPATCHED: sent}})
        task = task.model_copy(update={"checkpoint": checkpoint})
        rows = [dispatch_row(ctx.state.runs[rid].intent, ctx) for rid in stuck]
        await ctx.commit(Writes(kind="redispatch", tasks=[task], outbox=rows,
                                detail={"task_id": task.id, "runs": stuck}))


def live_children(task: Task, ctx: TaskContext) -> list[Task]:
    return [c for c in ctx.state.tasks.values() if c.parent == task.id and not c.terminal]


def wait_over(state: Waiting, ctx: TaskContext) -> bool:
    """allSettled: every awaited child terminal and run completed; failFast: or one failed."""
    settled = 0
    for i in state.on:
        child = ctx.state.tasks.get(i)
        run = ctx.state.runs.get(i) if child is None else None
        if child is not None:
            done = child.terminal
            failed = done and child.state.outcome != "completed"  # type: ignore[union-attr]
        elif run is not None:
            done = run.status == "completed"
            failed = done and (run.result is None or not run.result.ok)
        else:
            done, failed = True, False  # consumed or applied before
        if failed and state.policy == "failFast":
            return True
        settled += done
    return settled == len(state.on)
