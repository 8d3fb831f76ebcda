"""The built-in generation task: the agent loop as durable phases.

    pending ──prepare──▶ running@request ──model──▶ waiting@apply ──apply──▶ running@request ...
                                  └──final answer──▶ terminal{completed}, submission settled

* ``prepare`` fixes the model and marks the request phase ``running`` (committed), so a
  worker that dies during the model call is visible on load and counted (restart limit);
  one that stopped during it and handed the session over (release.lua) is not.
  A task that is the session's next generation when its request is taken up is started so
  in the commit that takes it up (:func:`started`, brain.requests): no ``prepare`` then.
* ``request`` calls the model outside any commit, then commits in one step the response
  entry, the tool runs (intent, replay policy, operation id), their outbox rows and the wait.
* ``retry`` (``sleeping{until}`` with a durable timer): a retryable model failure (429 with
  ``Retry-After``, 5xx, connection errors, timeouts, a truncated stream; brain.retry) waits
  with backoff, the failures and the deadline saved in the checkpoint, then re-issues the
  request as the next attempt; past the deadline, or on a non-retryable failure (4xx, a
  malformed answer), the task ends ``failed`` with ``model_error: <why>``.
* Streamed text goes out through throttled, losable partial commits (brain.stream) while the
  model answers. It is never a response: text streamed by an attempt that produced none
  (the worker died, the call failed) becomes an ``interrupted`` entry with the next commit,
  and the request is issued again; the model sees that text as interrupted.
* The request id is ``<task id>:<turn>:<attempt>``; the attempt counts retries and
  re-entries after a crash, so a re-issued request has a new id with the same prefix, its
  logical id ``<task id>:<turn>`` (the Idempotency-Key's stem, brain.model).
* ``apply`` commits the tool results as entries and the runs' ``applied`` mark together with
  the next request's ``running`` mark.
* ``cancel_requested`` (brain.cancel): no further phase runs; once the task's tool runs
  have ended (stopped through their heartbeat, or cancelled before any claim) their results
  are applied and the task ends ``cancelled``, its submission settled ``cancelled``.
* A tool declared ``approval=True`` gets its run committed ``awaiting_approval`` with the
  digest of its arguments and no dispatch row: ``baton approve`` dispatches it.
"""

from __future__ import annotations

from typing import Any, cast

from baton.brain.cancel import CANCELLED_BY, REASON, live_runs
from baton.brain.context import TaskContext
from baton.brain.interrupts import Interrupted, interruptible
from baton.brain.model import ModelRequest, ModelResponse, model_client, streams, visible_to
from baton.brain.redispatch import stuck_runs
from baton.brain.retry import retry_at
from baton.brain.stream import PartialText
from baton.errors import ModelRetryableError, ValidationError
from baton.models import (
    Checkpoint,
    Entry,
    OutboxRow,
    Running,
    Sleeping,
    Task,
    Terminal,
    ToolCall,
    ToolDispatch,
    ToolIntent,
    ToolResult,
    ToolRun,
    Waiting,
    dumps,
)
from baton.observability.log import bounded
from baton.observability.tracing import traced_model
from baton.store.control import args_digest
from baton.store.notices import settled_notice
from baton.store.writes import Writes, timer_member

KIND = "generation"


def runnable(task: Task, ctx: TaskContext) -> bool:
    state = task.state
    if task.cancel_requested:  # ends once its runs have (or to re-send a lost one)
        return not live_runs(task, ctx) or bool(stuck_runs(task, ctx))
    if state.name in ("pending", "running"):
        return True
    if state.name == "waiting":
        runs = [ctx.state.runs.get(r) for r in state.on]
        done = [r for r in runs if r is None or r.status == "completed"]
        if len(done) == len(runs):
            return True
        if state.policy == "failFast" and any(r and r.result and not r.result.ok for r in done):
            return True
        return bool(stuck_runs(task, ctx))
    if state.name == "sleeping":
        return state.until_ms <= ctx.now()
    return False


def started(task: Task, ctx: TaskContext) -> Task:
    """``task`` as the ``prepare`` phase leaves it: the request phase of turn 1 running."""
    return Generation._running(task, ctx, "request", {"turn": 1, "model": ctx.agent.model})


class Generation:
    """Handler of ``generation`` tasks (version 1)."""

    kind = KIND
    version = 1

    def runnable(self, task: Task, ctx: TaskContext) -> bool:
        return runnable(task, ctx)

    async def advance(self, task: Task, ctx: TaskContext) -> Task | None:
        """Run the task's next phase; the updated task if it can go on at once, else None."""
        state = task.state
        if task.cancel_requested:
            await self._cancelled(task, ctx)
            return None
        if state.name == "pending":
            return await self._prepare(task, ctx)
        if state.name == "running":
            return await self._request(task, ctx)
        if state.name == "waiting":
            return await self._apply(task, ctx)
        if state.name == "sleeping":
            return await self._resume(task, ctx)
        return None

    # ------------------------------------------------------------------ phases

    async def _prepare(self, task: Task, ctx: TaskContext) -> Task:
        task = started(task, ctx)
        writes = Writes(kind="prepare", tasks=[task], detail={"task_id": task.id, "turn": 1})
        sub = ctx.state.submissions.get(task.submission_id or "")
        if sub and sub.status == "accepted":
            writes.submissions.append(sub.model_copy(update={"status": "running"}))
        await ctx.commit(writes)
        return task

    async def _request(self, task: Task, ctx: TaskContext) -> Task | None:
        running = task.state
        assert isinstance(running, Running)
        # The request needs every entry: one that does not parse is the session's state
        # being corrupt (quarantined after bounded tries), never a crash of this phase to
        # count towards the task's restart limit.
        ctx.state.entries.decode_all()
        if running.fence != ctx.fence:
            # The state says running, but not under our lease: a worker died in this phase,
            # or stopped in it and handed the session over (release.lua), which is no crash.
            handed = ctx.state.meta.handed_over(running.fence)
            crashes = task.crashes if handed else task.crashes + 1
            (ctx.log.info if handed else ctx.log.warning)(
                "phase_handed_over" if handed else "phase_reentered", task_id=task.id,
                phase=task.checkpoint.phase, crashes=crashes, previous_worker=running.worker)
            writes = Writes(kind="reenter", detail={"task_id": task.id, "crashes": crashes})
            if handed:
                writes.detail["handed"] = running.fence
            saved = await ctx.store.partial(ctx.session_id)
            if saved and saved.task_id == task.id and saved.request_id == request_id_of(task):
                # Its text was streamed by the attempt that died: never a response.
                writes.entries.append(interrupted_entry(task, saved.text, ctx))
                writes.detail["interrupted"] = saved.request_id
            if crashes >= ctx.settings.restart_limit:
                reason = (f"restart limit: a worker died {crashes} times in phase "
                          f"{task.checkpoint.phase}")
                await self._finish(task.model_copy(update={"crashes": crashes}), ctx,
                                   "failed", reason=reason, writes=writes)
                return None
            task = self._running(task, ctx, task.checkpoint.phase,
                                 next_attempt(task.checkpoint.data), crashes=crashes)
            writes.tasks.append(task)
            await ctx.commit(writes)
        turn = int(task.checkpoint.data.get("turn", 1))
        agent = ctx.agent
        request_id = request_id_of(task)
        if agent.mcp:  # the tools Hands announce for its MCP servers
            from baton.mcp.catalog import learn

            await learn(ctx.app, ctx.store.redis, ctx.store.keys, ctx.now())
        request = ModelRequest(
            model=agent.model,
            instructions=agent.instructions,
            entries=visible_to(tuple(ctx.state.entries), task.id),
            tools=tuple(ctx.app.tools[t].schema() for t in ctx.app.agent_tools(agent)),
            request_id=request_id,
            logical_id=request_id.rsplit(":", 1)[0],
        )
        ctx.faults.hit("brain.during_model")
        partial = PartialText(ctx, task.id, request_id)
        try:
            client = self._model(agent.model, ctx)
            response = await interruptible(self._call(client, request, partial, ctx),
                                           task, ctx.state.tasks, ctx.cancels)
        except Interrupted:
            # A cancel request concerns this task: the answer is not waited for. Nothing is
            # committed; the pass loads the session again under its lease and takes the
            # request up (a task it turns out not to concern asks its model again).
            ctx.log.info("model_call_interrupted", task_id=task.id, request_id=request_id,
                         reason="cancel requested")
            ctx.yielded = True
            return None
        except ModelRetryableError as exc:
            await self._retry(task, ctx, exc, partial.text)
            return None
        except Exception as exc:  # a model error ends the task with a clear reason
            ctx.log.error("model_failed", task_id=task.id, request_id=request_id,
                          error=bounded(exc))
            writes = Writes(kind="final")
            if partial.text:
                writes.entries.append(interrupted_entry(task, partial.text, ctx))
            detail = attempt_record(task, request_id, error=exc)
            await self._finish(task, ctx, "failed", reason=f"model_error: {bounded(exc)}",
                               writes=writes, detail=detail)
            return None
        detail = attempt_record(task, request_id, response=response)
        if response.tool_calls:
            await self._dispatch(task, ctx, response, turn, detail=detail)
            ctx.faults.hit("brain.after_intent_commit")
            return None
        await self._finish(task, ctx, "completed", response=response, detail=detail)
        return None

    @staticmethod
    async def _call(client: Any, request: ModelRequest, partial: PartialText,
                    ctx: TaskContext) -> ModelResponse:
        if ctx.budgets is None or ctx.budgets.budget_of(request.model) is None:
            return await Generation._generate(client, request, partial)
        # the model's fleet-wide budget: wait for it, then give back what was not used
        async with ctx.budgets.admitted(request.model, request,
                                        tenant=ctx.state.meta.tenant) as charge:
            response = await Generation._generate(client, request, partial)
            if charge is not None:
                charge.used(response.usage)
            return response

    @staticmethod
    async def _generate(client: Any, request: ModelRequest,
                        partial: PartialText) -> ModelResponse:
        if streams(client):
            async with partial:
                return cast(ModelResponse, await client.generate(request, on_text=partial.add))
        return cast(ModelResponse, await client.generate(request))

    async def _retry(
        self, task: Task, ctx: TaskContext, exc: ModelRetryableError, streamed: str
    ) -> None:
        """A retryable failure: sleep until the backoff's time (durable), or give up."""
        data = dict(task.checkpoint.data)
        now = ctx.now()
        request_id = request_id_of(task)
        failures = int(data.get("failures", 0)) + 1
        since = int(data.get("retry_since_ms") or now)
        deadline = since + int(ctx.settings.model_retry_deadline_s * 1000)
        until = retry_at(ctx.settings, now, failures, deadline, exc.retry_after_s)
        attempt = attempt_record(task, request_id, error=exc)
        writes = Writes(kind="retry")
        if streamed:
            writes.entries.append(interrupted_entry(task, streamed, ctx))
        ctx.log.warning("model_retry" if until else "model_gave_up", task_id=task.id,
                        request_id=request_id, error=bounded(exc), failures=failures,
                        retry_in_ms=until - now if until else None)
        if until is None:
            reason = (f"model_error: gave up after {failures} failed attempts "
                      f"({(now - since) / 1000:.1f}s): {bounded(exc)}")
            await self._finish(task, ctx, "failed", reason=reason, writes=writes,
                               detail=attempt)
            return
        data.update(failures=failures, retry_since_ms=since, deadline_ms=deadline,
                    until_ms=until, last_error=str(exc)[:500],
                    attempts=[*data.get("attempts", ()), attempt])
        task = task.model_copy(update={
            "state": Sleeping(until_ms=until),
            "checkpoint": Checkpoint(phase="retry", data=data, step=task.checkpoint.step),
            "crashes": 0, "updated_ms": now,
        })
        writes.tasks.append(task)
        writes.timers_add[self._timer(task, ctx)] = until
        writes.detail = {"task_id": task.id, **attempt, "until_ms": until,
                         "retry_in_ms": until - now}
        await ctx.commit(writes)

    async def _resume(self, task: Task, ctx: TaskContext) -> Task:
        """The retry timer is due: mark the request phase running for the next attempt."""
        task = self._running(task, ctx, "request", next_attempt(task.checkpoint.data))
        await ctx.commit(Writes(kind="resume", tasks=[task],
                                timers_remove=[self._timer(task, ctx)],
                                detail={"task_id": task.id,
                                        "request_id": request_id_of(task)}))
        return task

    async def _dispatch(
        self, task: Task, ctx: TaskContext, response: ModelResponse, turn: int,
        detail: dict[str, Any] | None = None,
    ) -> None:
        agent, meta = ctx.agent, ctx.state.meta
        group = f"{task.id}-{turn}"
        entry = Entry(kind="model", text=response.text, tool_calls=response.tool_calls,
                      task_id=task.id, submission_id=task.submission_id, usage=response.usage,
                      ts_ms=ctx.now())
        writes = Writes(kind="tools", entries=[entry])
        now = ctx.now()
        offered = ctx.app.agent_tools(agent)
        for i, call in enumerate(response.tool_calls):
            if call.name not in offered:
                writes.entries.append(refusal_entry(task, call, ctx))
                continue
            tool = ctx.app.tools[call.name]
            if tool.approval:  # never put arguments that cannot run in front of a person
                try:
                    tool.parse_args(call.arguments)
                except ValidationError as exc:
                    writes.entries.append(refusal_entry(task, call, ctx, "invalid_arguments",
                                                        exc.message))
                    continue
            run_id = f"{group}-{i}"
            digest = args_digest(call.name, call.arguments) if tool.approval else None
            intent = ToolIntent(
                run_id=run_id, session_id=ctx.session_id, task_id=task.id, tool=call.name,
                tool_version=tool.version, arguments=call.arguments, replay=tool.replay,
                operation_id=f"{ctx.session_id}:{run_id}", tool_call_id=call.id,
                wake_subject=meta.wake_subject, group=group, created_ms=now,
                approval_digest=digest,
            )
            writes.runs.append(intent)
            if digest is not None:  # dispatched by the approval (baton.store.control)
                writes.awaiting[run_id] = digest
            else:
                writes.outbox.append(self._dispatch_row(intent, ctx))
        if writes.runs:
            writes.groups[group] = len(writes.runs)
            task = task.model_copy(update={
                "state": Waiting(on=tuple(r.run_id for r in writes.runs)),
                "checkpoint": Checkpoint(phase="apply", data={"turn": turn, "group": group}),
                "crashes": 0, "updated_ms": now,
            })
        else:  # every call was refused: the model sees why on its next turn
            task = self._running(task, ctx, "request", {"turn": turn + 1, "model": agent.model})
        writes.tasks.append(task)
        writes.detail = {"task_id": task.id, "turn": turn, "runs": [r.run_id for r in writes.runs],
                         **(detail or {})}
        await ctx.commit(writes)

    async def _redispatch(self, task: Task, ctx: TaskContext, stuck: list[ToolRun]) -> None:
        sent = dict(task.checkpoint.data.get("redispatched", {}))
        now = ctx.now()
        for run in stuck:
            sent[run.run_id] = sent.get(run.run_id, 0) + 1
            sent[f"{run.run_id}@"] = now
            ctx.log.warning("tool_redispatched", run_id=run.run_id, status=run.status,
                            times=sent[run.run_id])
        data = {**task.checkpoint.data, "redispatched": sent}
        task = task.model_copy(update={"checkpoint": Checkpoint(phase="apply", data=data)})
        await ctx.commit(Writes(kind="redispatch", tasks=[task],
                                outbox=[self._dispatch_row(r.intent, ctx) for r in stuck],
                                detail={"task_id": task.id, "runs": [r.run_id for r in stuck]}))

    async def _apply(self, task: Task, ctx: TaskContext) -> Task | None:
        state = task.state
        assert isinstance(state, Waiting)
        runs = [ctx.state.runs.get(r) for r in state.on]
        if not all(r is None or r.status == "completed" for r in runs) and (
            stuck := stuck_runs(task, ctx)
        ):
            await self._redispatch(task, ctx, stuck)
            return None
        turn = int(task.checkpoint.data.get("turn", 1))
        writes = Writes(kind="apply")
        for rid in state.on:
            run = ctx.state.runs.get(rid)
            if run is None or run.result is None:
                continue  # applied earlier (a re-entered phase) or cancelled
            writes.entries.append(result_entry(task, run, ctx))
            writes.applied.append(rid)
        agent = ctx.agent
        if turn + 1 > agent.max_turns:
            writes.kind = "apply_final"
            await self._finish(task, ctx, "failed", writes=writes,
                               reason=f"max turns ({agent.max_turns}) reached")
            return None
        task = self._running(task, ctx, "request", {"turn": turn + 1, "model": agent.model})
        writes.tasks.append(task)
        writes.detail = {"task_id": task.id, "turn": turn, "applied": writes.applied}
        await ctx.commit(writes)
        return task

    async def _cancelled(self, task: Task, ctx: TaskContext) -> None:
        if live_runs(task, ctx):
            if stuck := stuck_runs(task, ctx):
                await self._redispatch(task, ctx, stuck)  # a claim then says 'cancelled'
            return
        writes = Writes(kind="final")
        for rid, run in ctx.state.runs.items():  # the stopped runs' results, for the record
            if run.intent.task_id == task.id and run.result is not None:
                writes.entries.append(result_entry(task, run, ctx))
                writes.applied.append(rid)
        reason = str(task.checkpoint.data.get(CANCELLED_BY) or REASON)  # the client's, if given
        await self._finish(task, ctx, "cancelled", reason=reason, writes=writes)

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _running(
        task: Task, ctx: TaskContext, phase: str, data: dict[str, Any], crashes: int = 0
    ) -> Task:
        return task.model_copy(update={
            "state": Running(worker=ctx.worker.name, fence=ctx.fence, since_ms=ctx.now()),
            "checkpoint": Checkpoint(phase=phase, data=data),
            "crashes": crashes,
            "updated_ms": ctx.now(),
        })

    async def _finish(
        self,
        task: Task,
        ctx: TaskContext,
        outcome: str,
        *,
        response: ModelResponse | None = None,
        reason: str = "",
        writes: Writes | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        writes = writes or Writes(kind="final")
        writes.kind = "final"
        answer = response.text if response else None
        if response:
            writes.entries.append(Entry(kind="model", text=response.text, task_id=task.id,
                                        submission_id=task.submission_id, usage=response.usage,
                                        ts_ms=ctx.now()))
        done = task.model_copy(update={
            "state": Terminal(outcome=outcome, reason=reason),  # type: ignore[arg-type]
            "result": {"answer": answer} if answer is not None else None,
            "updated_ms": ctx.now(),
        })
        writes.tasks.append(done)
        sub = ctx.state.submissions.get(task.submission_id or "")
        if sub:
            status = outcome if outcome in ("completed", "cancelled") else "failed"
            settled = sub.model_copy(update={
                "status": status,
                "answer": answer, "error": reason or None, "settled_ms": ctx.now(),
            })
            writes.submissions.append(settled)
            # the settled record itself: a waiting client returns it without a read
            writes.notify.append((ctx.store.keys.settled_channel(ctx.session_id),
                                  settled_notice(settled)))
        writes.detail = {"task_id": task.id, "outcome": outcome, **(detail or {})}
        if reason:
            writes.detail["reason"] = reason
        await ctx.commit(writes)

    def _dispatch_row(self, intent: ToolIntent, ctx: TaskContext) -> OutboxRow:
        msg = ToolDispatch(session_id=ctx.session_id, run_id=intent.run_id, tool=intent.tool)
        return OutboxRow(subject=ctx.names.tool_subject(intent.tool), data=msg.to_json(),
                         headers=dict(intent.trace))

    def _model(self, name: str, ctx: TaskContext) -> Any:
        """The app's own client for ``name``, else one built once per Brain (brain.model)."""
        if name in ctx.app.models:
            return traced_model(name, ctx.app.models[name])  # the model call's span
        if name not in ctx.models:
            ctx.models[name] = traced_model(name, model_client(name, ctx.settings))
        return ctx.models[name]

    def _timer(self, task: Task, ctx: TaskContext) -> str:
        return timer_member("task", ctx.session_id, task.id, ctx.state.meta.wake_subject)


# ------------------------------------------------------------------ model attempts
# Their derived request ids and what each one cost and how it ended (saved in receipts
# and checkpoints).

def request_id_of(task: Task) -> str:
    """Derived, never random: ``<task id>:<turn>:<attempt>``."""
    data = task.checkpoint.data
    return f"{task.id}:{int(data.get('turn', 1))}:{int(data.get('attempt', 0))}"


def next_attempt(data: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint data of the request's next attempt (its retry wait over)."""
    out = {k: v for k, v in data.items() if k != "until_ms"}
    out["attempt"] = int(data.get("attempt", 0)) + 1
    return out


def attempt_record(
    task: Task, request_id: str, *, response: ModelResponse | None = None,
    error: Exception | None = None,
) -> dict[str, Any]:
    """What one model attempt cost and how it ended: saved in receipts and checkpoints."""
    usage = response.usage if response else getattr(error, "usage", None)
    out: dict[str, Any] = {
        "request_id": request_id,
        "attempt": int(task.checkpoint.data.get("attempt", 0)),
        "usage": usage.model_dump() if usage else {"input_tokens": 0, "output_tokens": 0},
    }
    if response is not None and response.provider_request_id:
        out["provider_request_id"] = response.provider_request_id
    if error is not None:
        out["error"] = str(error)[:500]
        if getattr(error, "status", None):
            out["status"] = error.status  # type: ignore[attr-defined]
    return out


# ------------------------------------------------------------------ entries
# What a generation writes for the model to read: tool results (run, refused) and text an
# attempt streamed before it was cut off.

def result_text(result: ToolResult) -> str:
    """How a tool result appears to the model: its JSON, with the recovery it went through."""
    return dumps(
        {
            "outcome": result.outcome,
            "recovery": result.recovery,
            "output": result.output,
            "error_code": result.error_code,
            "error": result.error,
        }
    )


def result_entry(task: Task, run: ToolRun, ctx: TaskContext) -> Entry:
    """A completed run's result, as the model reads it on its next turn."""
    result = run.result
    assert result is not None
    return Entry(kind="tool_result", text=result_text(result), run_id=run.run_id,
                 tool_call_id=run.intent.tool_call_id, tool_name=run.intent.tool,
                 is_error=not result.ok, task_id=task.id,
                 submission_id=task.submission_id, ts_ms=ctx.now())


def refusal_entry(task: Task, call: ToolCall, ctx: TaskContext, code: str = "unknown_tool",
                  error: str = "") -> Entry:
    """A call that is not run: the model sees why on its next turn."""
    result = ToolResult(outcome="error", error_code=code,
                        error=error or f"tool {call.name!r} is not available to this agent")
    return Entry(kind="tool_result", text=result_text(result), tool_call_id=call.id,
                 tool_name=call.name, is_error=True, task_id=task.id,
                 submission_id=task.submission_id, ts_ms=ctx.now())


def interrupted_entry(task: Task, text: str, ctx: TaskContext) -> Entry:
    """Text streamed by an attempt that produced no response: never a response itself."""
    return Entry(kind="interrupted", text=text, task_id=task.id,
                 submission_id=task.submission_id, ts_ms=ctx.now())
