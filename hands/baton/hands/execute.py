"""Deciding and executing one tool run: the result a claimed attempt completes with.

Owns the replay-aware decision (:meth:`ToolExecution.result`: cancelled, unknown tool, bad
arguments, interrupt, confirm, re-execute), running the tool under its deadline while
heartbeating the attempt (:meth:`ToolExecution._supervised`, :meth:`ToolExecution._beat`),
the output limit (:meth:`ToolExecution.limit`), and the error results.
:class:`~baton.hands.worker.HandsWorker` builds one :class:`ToolExecution` once it is
connected and hands it each claimed attempt; the worker owns the lifecycle and the
per-message protocol (claim, result, complete, ack).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx
import orjson
from pydantic import BaseModel

from baton.app import Tool, ToolContext
from baton.errors import StaleAttemptError, ToolError, ValidationError
from baton.hands import retries
from baton.hands.http import as_tool_error
from baton.hands.isolation import run_isolated
from baton.hands.replay import decide
from baton.models import Recovery, ToolIntent, ToolResult, WorkerRef
from baton.observability.log import bounded, get_logger
from baton.settings import Settings
from baton.store.runs import Runs
from baton.store.state import Claim

log = get_logger("baton.hands")

MAX_ERROR_TEXT = 2_000
CANCEL_GRACE_S = 5.0  # wait this long for a cancelled tool to end
CONFIRM_STOPPED_S = 10.0  # at most this long for a confirm after a stop (or the tool's timeout)
ISOLATED_START_GRACE_S = 10.0  # an isolated tool's child may take this long to start


#: What a confirm that could not answer returns (see Execution._confirm_stopped).
_UNKNOWN = object()


class RunCancelled(Exception):
    """The Brain asked the run to stop (its heartbeat said so): the tool was cancelled.

    ``output`` is what the tool returned if it ended on its own after ``ctx.cancelled``.
    """

    def __init__(self, run_id: str, output: Any = None) -> None:
        super().__init__(run_id)
        self.output = output


class AttemptLost(Exception):
    """Our attempt was taken over (or ended) while running: stop touching the run."""

    def __init__(self, err: StaleAttemptError) -> None:
        super().__init__(str(err))
        self.err = err


class ToolExecution:
    """Turns a claimed attempt into its result.

    ``tools`` are the tools served here, ``runs`` heartbeats the attempt as ``worker``,
    ``http`` is the client every :class:`~baton.app.ToolContext` gets.
    """

    def __init__(
        self, settings: Settings, tools: Mapping[str, Tool], runs: Runs, worker: WorkerRef,
        http: httpx.AsyncClient,
    ) -> None:
        self.settings = settings
        self.tools = tools
        self.runs = runs
        self.worker = worker
        self.http = http
        self._logs: dict[str, Any] = {}  # each tool's ctx.log, bound once

    async def result(self, claim: Claim, intent: ToolIntent, delivery: int) -> ToolResult | None:
        """The run's result, or None to leave it for a later delivery."""
        attempt = claim.attempt
        tool = self.tools.get(intent.tool)
        if claim.cancelled:  # stopped by the Brain before this attempt: never execute it
            if claim.recovering and tool is not None and tool.confirm_fn is not None:
                # an earlier attempt may have acted before the cancel stopped it: ask
                return await self._cancelled_after(tool, intent, attempt)
            return _cancelled_before(attempt)
        if tool is None:
            return _error(attempt, "unknown_tool",
                          f"no tool named {intent.tool!r} is served here; "
                          f"available: {', '.join(self.tools)}")
        try:
            args = tool.parse_args(intent.arguments)
        except ValidationError as exc:
            return _error(attempt, "invalid_arguments", exc.message)
        decision = decide(
            recovering=claim.recovering,
            saved=intent.replay,
            current=tool.replay,
            has_confirm=tool.confirm_fn is not None,
            delivery=delivery,
            max_deliver=self.settings.max_deliver,
        )
        ctx = self._context(tool, intent, attempt)
        if decision.action == "interrupt":
            return ToolResult(outcome="interrupted", error_code="interrupted",
                              error=decision.reason, recovery="interrupted", attempt=attempt)
        if decision.action == "fail":
            return ToolResult(outcome="failed", error_code="max_deliveries",
                              error=decision.reason, recovery="interrupted", attempt=attempt)
        if decision.action == "confirm":
            assert tool.confirm_fn is not None
            confirm = tool.confirm_fn
            started = time.monotonic()
            try:
                found = await self._supervised(
                    intent, ctx, self._deadline(tool),
                    lambda: self._isolated(tool, "confirm", args, ctx)
                    if tool.isolation == "process" else confirm(intent.operation_id, args, ctx),
                )
            except AttemptLost:
                raise
            except RunCancelled:
                return _cancelled(attempt, "executed_after_confirm", started)
            except Exception as exc:  # cannot tell what happened: try again later
                log.warning("confirm_failed", error=bounded(_describe(exc)))
                return None
            log.info("confirm_answered", found=found is not None)
            if found is not None:
                return ToolResult(outcome="ok", output=found, recovery="confirmed",
                                  attempt=attempt, duration_ms=_ms_since(started))
            return await self._execute(tool, args, intent, ctx, "executed_after_confirm")
        recovery: Recovery = "reexecuted" if decision.action == "reexecute" else "none"
        return await self._execute(tool, args, intent, ctx, recovery)

    async def _cancelled_after(self, tool: Tool, intent: ToolIntent, attempt: int
                               ) -> ToolResult | None:
        """A cancelled run whose earlier attempt ended without a result: a confirm tool's
        confirm says whether that attempt acted (ok, confirmed) or not (cancelled); None
        when it cannot tell yet (a later delivery asks again)."""
        try:
            args = tool.parse_args(intent.arguments)
        except ValidationError:
            return _cancelled_before(attempt)
        ctx = self._context(tool, intent, attempt)
        found = await self._confirm_stopped(
            tool, self._confirm_call(tool, intent, args, ctx), "cancelled")
        if found is _UNKNOWN:
            return None
        if found is not None:
            return ToolResult(outcome="ok", output=found, recovery="confirmed", attempt=attempt)
        return _cancelled_before(attempt)

    def _context(self, tool: Tool, intent: ToolIntent, attempt: int) -> ToolContext:
        return ToolContext(
            session_id=intent.session_id, run_id=intent.run_id,
            operation_id=intent.operation_id, attempt=attempt, settings=self.settings,
            http=self.http, log=self._log(tool.name))

    def _confirm_call(self, tool: Tool, intent: ToolIntent, args: BaseModel,
                      ctx: ToolContext) -> Callable[[], Awaitable[Any]] | None:
        """The tool's confirm for this run, ready to await (in a child process for an
        isolated tool); None for a tool without one."""
        if tool.confirm_fn is None:
            return None
        if tool.isolation == "process":
            return functools.partial(self._isolated, tool, "confirm", args, ctx)
        return functools.partial(_contained, tool.confirm_fn, intent.operation_id, args, ctx)

    def _log(self, tool: str) -> Any:
        found = self._logs.get(tool)
        if found is None:
            found = self._logs[tool] = log.bind(tool=tool)
        return found

    async def _execute(
        self, tool: Tool, args: BaseModel, intent: ToolIntent, ctx: ToolContext,
        recovery: Recovery,
    ) -> ToolResult | None:
        started = time.monotonic()
        attempt = ctx.attempt
        confirm = self._confirm_call(tool, intent, args, ctx)
        # A plain tool's function directly (Tool.__call__ only awaits it), else the tool
        call: Callable[[], Awaitable[Any]] = functools.partial(
            _contained, tool.fn if type(tool).__call__ is Tool.__call__ else tool, args, ctx)
        if tool.isolation == "process":  # the tool, and its confirm, in a child process
            call = functools.partial(self._isolated, tool, "tool", args, ctx)
        try:
            output, confirmed = await self._supervised(
                intent, ctx, self._deadline(tool), lambda: retries.call_with_retries(
                    call, timeout=self._deadline(tool), replay=tool.replay,
                    retry_on=tool.retry_on, confirm=confirm))
            if confirmed:
                recovery = "confirmed"
        except AttemptLost:
            raise
        except RunCancelled as exc:
            log.info("tool_cancelled")
            if exc.output is None:
                found = await self._confirm_stopped(tool, confirm, "cancelled")
                if found is _UNKNOWN:
                    return None  # a later delivery confirms first (see result())
                if found is not None:
                    return ToolResult(outcome="ok", output=found, recovery="confirmed",
                                      attempt=attempt, duration_ms=_ms_since(started))
            return _cancelled(attempt, recovery, started, exc.output)
        except ToolError as exc:
            return _error(attempt, exc.code, exc.message, recovery, started)
        except httpx.HTTPError as exc:  # the server's failure, not the tool's: say what failed
            failed = as_tool_error(exc)
            return _error(attempt, failed.code, failed.message, recovery, started)
        except _Timeout:
            found = await self._confirm_stopped(tool, confirm, "timeout")
            if found is _UNKNOWN:
                return None  # the outcome is unknown: a later delivery confirms first
            if found is not None:
                return ToolResult(outcome="ok", output=found, recovery="confirmed",
                                  attempt=attempt, duration_ms=_ms_since(started))
            stopped = " (stopped mid-call: it may have taken effect)" \
                if tool.replay == "unsafe" else ""
            return _error(attempt, "timeout", f"{tool.name} did not finish within "
                          f"{tool.timeout:g}s{stopped}", recovery, started)
        except Exception as exc:  # a tool bug is a result the model sees, never a crash
            log.warning("tool_raised", error=bounded(_describe(exc)))
            return _error(attempt, "tool_exception", _describe(exc), recovery, started)
        return ToolResult(outcome="ok", output=output, recovery=recovery, attempt=attempt,
                          duration_ms=_ms_since(started))

    @staticmethod
    async def _confirm_stopped(tool: Tool, confirm: Callable[[], Awaitable[Any]] | None,
                               why: str) -> Any:
        """A ``confirm`` tool stopped mid-call (its deadline passed, or a cancel) may have
        acted, as after an ambiguous error: its confirm function is asked, and a found
        result is the run's (else a mail that went out would read as never sent, and the
        model would send it again). None when not found (or not a confirm tool);
        :data:`_UNKNOWN` when confirm could not tell either (the outside system is down):
        the run is left unfinished for a later delivery, which confirms first, as a
        takeover does."""
        if confirm is None or tool.replay != "confirm":
            return None
        try:
            async with asyncio.timeout(min(tool.timeout, CONFIRM_STOPPED_S)):
                found = await confirm()
        except Exception as exc:  # cannot tell what happened: try again later
            log.warning("confirm_after_stop_failed", stopped=why, error=bounded(_describe(exc)),
                        note="left for a later delivery, which confirms first")
            return _UNKNOWN
        if found is not None:
            log.info("confirm_adopted", reason=f"stopped mid-call ({why})")
        return found

    @staticmethod
    def _deadline(tool: Tool) -> float:
        """The call's deadline; an isolated tool's own wall time (enforced by killing the
        child, reported as ``tool_timeout``) comes first, with room for the child to start."""
        if tool.isolation == "process":
            return tool.wall_time_s + ISOLATED_START_GRACE_S
        return tool.timeout

    def _isolated(self, tool: Tool, call: str, args: BaseModel, ctx: ToolContext
                  ) -> Awaitable[Any]:
        return run_isolated(tool, call, args, ctx, max_answer=self.settings.max_payload_bytes)

    async def _supervised(
        self, intent: ToolIntent, ctx: ToolContext, timeout: float,  # noqa: ASYNC109
        call: Callable[[], Awaitable[Any]],
    ) -> Any:
        """Run ``call`` with a deadline while heartbeating the attempt in Redis.

        Raises :class:`AttemptLost` (after cancelling the call) once the heartbeat finds the
        attempt taken over, :class:`RunCancelled` once it says the Brain cancelled the run
        (``ctx.cancelled`` is set, then the call is cancelled), and :class:`_Timeout` when
        the deadline passes.
        """

        async def within_deadline() -> Any:
            deadline = asyncio.timeout(timeout)
            try:
                async with deadline:
                    return await call()
            except TimeoutError:
                if deadline.expired():
                    raise _Timeout() from None
                raise

        loop = asyncio.get_running_loop()
        work = loop.create_task(within_deadline())
        beat: asyncio.Task[None] | None = None
        stop: asyncio.Event | None = None  # made with the beat: most calls end before it

        def on_beat_done(task: asyncio.Task[None]) -> None:
            if not task.cancelled() and task.exception() is not None and not work.done():
                ctx.cancelled.set()  # taken over or cancelled: stop the tool
                work.cancel()

        def start_beat() -> None:  # most calls end before the first beat is due
            nonlocal beat, stop
            stop = asyncio.Event()
            beat = loop.create_task(self._beat(intent, ctx.attempt, stop))
            beat.add_done_callback(on_beat_done)

        timer = loop.call_later(self.settings.attempt_ttl_ms / 3000, start_beat)
        try:
            await asyncio.wait({work})
        finally:
            timer.cancel()
            if stop is not None:
                stop.set()
            if not work.done():  # we are being cancelled ourselves
                ctx.cancelled.set()
                work.cancel()
            pending = {t for t in (work, beat) if t is not None and not t.done()}
            if beat is not None:
                beat.cancel()
            if pending:
                # Bounded: a task may swallow its cancellation (redis-py does, mid-command).
                _, stuck = await asyncio.wait(pending, timeout=CANCEL_GRACE_S)
                if stuck:
                    log.warning("cancel_ignored", tasks=[t.get_name() for t in stuck])
        if work.cancelled():
            err = beat.exception() if beat is not None and beat.done() and not beat.cancelled() \
                else None
            if isinstance(err, StaleAttemptError):
                raise AttemptLost(err)
            if isinstance(err, RunCancelled):
                raise err
            raise RuntimeError("the tool was cancelled")  # not by us: a tool bug
        if ctx.cancelled.is_set() and beat is not None and beat.done() and not beat.cancelled() \
                and isinstance(beat.exception(), RunCancelled):
            # The tool saw ctx.cancelled and returned before its cancellation landed.
            raise RunCancelled(intent.run_id, work.result())
        return work.result()

    async def _beat(self, intent: ToolIntent, attempt: int, stop: asyncio.Event) -> None:
        """Keep the attempt alive until ``stop``; ends early only by raising StaleAttemptError
        (taken over) or RunCancelled (the Brain cancelled the run).

        ``stop`` is checked after every beat because a cancellation that arrives during a
        Redis command can be swallowed by redis-py (redis/redis-py#2028).
        """
        interval = self.settings.attempt_ttl_ms / 3000
        first = True
        while not stop.is_set():
            if not first:  # the first beat is due when this task starts
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval)
                if stop.is_set():
                    return
            first = False
            try:
                cancelled = await self.runs.heartbeat(
                    intent.session_id, intent.run_id, attempt, self.worker
                )
            except StaleAttemptError:
                raise
            except Exception as exc:  # Redis away for a moment: the tool goes on
                log.warning("run_heartbeat_failed", error=bounded(exc))
                continue
            if cancelled:
                raise RunCancelled(intent.run_id)

    def limit(self, result: ToolResult) -> ToolResult:
        """Cut an output larger than ``tool_output_limit`` (as JSON), marking it truncated."""
        limit = self.settings.tool_output_limit
        converted = False

        def model_data(value: Any) -> Any:  # a pydantic model returned as is: its data
            nonlocal converted
            if isinstance(value, BaseModel):
                converted = True
                return value.model_dump(mode="json")
            raise TypeError(type(value).__name__)

        try:
            raw = orjson.dumps(result.output, default=model_data)
        except TypeError:  # values JSON has no form for: their text, where they are
            raw, converted = json_with_text(result.output), True
            log.warning("tool_output_not_json",  # the run's ids are bound to the line
                        note="values JSON has no form for were replaced by their repr()")
        else:
            if b"null" in raw and _not_finite(result.output):  # orjson writes NaN as null
                converted = True
                log.warning("tool_output_not_json",
                            note="NaN and infinite numbers were written as null")
        if converted:  # the output is what its JSON says
            result = result.model_copy(update={"output": orjson.loads(raw)})
        if len(raw) <= limit:
            return result
        head = raw[:limit].decode("utf-8", errors="ignore")
        marker = f"... [truncated: {len(raw)} bytes of JSON, limit {limit}]"
        return result.model_copy(update={"output": head + marker, "truncated": True})


def json_with_text(value: Any) -> bytes:
    """``value`` as JSON, each part JSON has no form for (an object, a set) replaced by its
    ``repr()`` where it is: the rest keeps its structure (dates as ISO text, as orjson
    writes them, pydantic models as their data); the whole value's repr() if even that
    fails."""
    try:
        return orjson.dumps(value, default=_model_data_or_repr,
                            option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return orjson.dumps(repr(value))


def _model_data_or_repr(value: Any) -> Any:
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else repr(value)


def _not_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_not_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_not_finite(v) for v in value)
    return False


class ToolExited(Exception):
    """A tool raised a BaseException that is not an Exception (SystemExit, KeyboardInterrupt,
    GeneratorExit, its own): a bug of the tool like any other. Left to itself, SystemExit
    and KeyboardInterrupt leave the event loop and end the Hands (each redelivery of the run
    the next one), and the others escape the result and run the tool again at every
    redelivery."""


async def _contained(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    try:
        return await fn(*args)
    except asyncio.CancelledError:
        raise  # the run's own cancellation and deadline
    except Exception:
        raise
    except BaseException as exc:
        raise ToolExited(f"the tool raised {_describe(exc)}; a tool may not end its "
                         f"process or raise outside Exception") from None


class _Timeout(Exception):
    """The tool's own deadline passed."""


def _error(
    attempt: int, code: str, message: str, recovery: Recovery = "none",
    started: float | None = None,
) -> ToolResult:
    return ToolResult(
        outcome="error", error_code=code, error=message[:MAX_ERROR_TEXT], recovery=recovery,
        attempt=attempt, duration_ms=_ms_since(started) if started is not None else 0.0,
    )


def _cancelled_before(attempt: int) -> ToolResult:
    return ToolResult(outcome="cancelled", error_code="cancelled",
                      error="cancelled before this attempt ran", attempt=attempt)


def _cancelled(attempt: int, recovery: Recovery, started: float, output: Any = None
               ) -> ToolResult:
    return ToolResult(outcome="cancelled", output=output, error_code="cancelled",
                      error="cancelled by request while running", recovery=recovery,
                      attempt=attempt, duration_ms=_ms_since(started))


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _ms_since(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 3)


__all__ = ["CANCEL_GRACE_S", "AttemptLost", "RunCancelled", "ToolExecution", "ToolExited"]
