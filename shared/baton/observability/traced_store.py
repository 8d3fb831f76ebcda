"""The spans and counters around the store's writes that hand work over (commit, submit,
complete) or take it up (claim, lease), and the refusals counted at each; see
:mod:`baton.observability.tracing` for how the context travels."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from opentelemetry.trace import SpanKind

from baton.errors import StaleAttemptError, StaleFenceError
from baton.observability.propagation import carries_context, inject
from baton.observability.spans import (
    NATS,
    NO_SPAN,
    SESSION,
    count_committed,
    count_refused,
    db_attrs,
    enter_span,
    headers_to_hand_on,
    record_handoff,
    recording_tracer,
)
from baton.observability.telemetry import instruments

__all__ = [
    "counted_refusals", "traced_claim", "traced_commit", "traced_complete", "traced_lease",
    "traced_recheck", "traced_submit",
]

F = TypeVar("F", bound=Callable[..., Any])


def _stamp(writes: Any, carrier: dict[str, str]) -> None:
    """Save the committing span's context with what the commit hands over: the receipt,
    the tool runs it creates and its outbox rows (unless a row carries one already: a tool
    message sent again carries the context saved in its run's intent)."""
    if not writes.trace:
        writes.trace = dict(carrier)
    if writes.runs:
        writes.runs[:] = [r if r.trace else r.model_copy(update={"trace": dict(carrier)})
                          for r in writes.runs]
    if writes.outbox:
        writes.outbox[:] = [
            o if carries_context(o.headers)
            else o.model_copy(update={"headers": {**o.headers, **carrier}})
            for o in writes.outbox
        ]


def traced_commit(fn: F) -> F:
    """``Store.commit``: span ``commit <kind>``, context saved with the commit; counted."""

    @functools.wraps(fn)
    async def commit(self: Any, session_id: str, fence: int, writes: Any, worker: Any) -> Any:
        t, inst = recording_tracer(), instruments()
        if t is None:
            handed_on = headers_to_hand_on()
            if handed_on is not None:  # not recorded here: the trace goes on with the commit
                _stamp(writes, handed_on)
            if inst is None:
                return await fn(self, session_id, fence, writes, worker)
        with NO_SPAN if t is None else enter_span(
            t, f"commit {writes.kind}", **db_attrs("commit"), **{
                SESSION: session_id, "baton.fence": fence, "baton.commit.kind": writes.kind,
                "baton.outbox_rows": len(writes.outbox), "baton.tool_runs": len(writes.runs)},
        ) as span:
            if t is not None:
                _stamp(writes, inject())
            try:
                result = await fn(self, session_id, fence, writes, worker)
            except StaleFenceError as exc:
                count_refused(inst, "commit", exc)
                raise
            if t is not None and span.is_recording():
                span.set_attribute("baton.seq", int(result[0]))
            count_committed(inst, "commit", writes.kind)
            return result

    return commit  # type: ignore[return-value]


def traced_submit(op: str) -> Callable[[F], F]:
    """``Store.submit`` / ``Store.start_task``: a span creating the session's wake; its
    context goes with the wake row and the receipt (the method's ``headers``).

    The span is a child of the caller's current span: a host application's request span
    becomes the root of the whole trace. A caller that carries a context but records no
    spans (propagation only) still hands its trace on in the headers.
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        async def submit(self: Any, session_id: str, **kw: Any) -> Any:
            t, inst = recording_tracer(), instruments()
            if t is None:
                handed_on = headers_to_hand_on()
                if handed_on is not None:  # a context without spans here: handed on all the same
                    kw["headers"] = handed_on
                if inst is None:
                    return await fn(self, session_id, **kw)
            with NO_SPAN if t is None else enter_span(
                t, op, SpanKind.PRODUCER, **db_attrs(op), **NATS, **{
                    SESSION: session_id, "baton.request_id": kw.get("request_id"),
                    "messaging.destination.name": kw.get("wake_subject"),
                    "messaging.operation.type": "create", "messaging.operation.name": op,
                },
            ) as span:
                if t is not None:
                    kw["headers"] = inject()
                result = await fn(self, session_id, **kw)
                created = bool(result[-1])
                if t is not None and span.is_recording():
                    span.set_attribute("baton.created", created)
                if created:
                    count_committed(inst, op)
                return result

        return submit  # type: ignore[return-value]

    return decorate


def traced_complete(fn: F) -> F:
    """``Runs.complete``: span ``complete <tool>``; its context goes with the wake row."""

    @functools.wraps(fn)
    async def complete(self: Any, session_id: str, intent: Any, attempt: int, result: Any,
                       worker: Any, **kw: Any) -> Any:
        t, inst = recording_tracer(), instruments()
        if t is None:
            handed_on = headers_to_hand_on()
            if handed_on is not None:  # not recorded here: the trace goes on with the wake
                kw["headers"] = handed_on
            if inst is None:
                return await fn(self, session_id, intent, attempt, result, worker, **kw)
        with NO_SPAN if t is None else enter_span(
            t, f"complete {intent.tool}", **db_attrs("complete"), **{
                SESSION: session_id, "baton.run_id": intent.run_id,
                "baton.task_id": intent.task_id, "baton.fence": attempt,
                "baton.outcome": result.outcome, "baton.recovery": result.recovery},
        ) as span:
            if t is not None:
                kw["headers"] = inject()
            try:
                woke = await fn(self, session_id, intent, attempt, result, worker, **kw)
            except StaleAttemptError as exc:
                count_refused(inst, "complete", exc)
                raise
            if t is not None and span.is_recording():
                span.set_attribute("baton.woke", bool(woke))
            count_committed(inst, "complete")
            return woke

    return complete  # type: ignore[return-value]


def traced_claim(fn: F) -> F:
    """``Runs.claim``: span ``claim``; takeovers and the dispatch hop (commit -> claim)."""

    @functools.wraps(fn)
    async def claim(self: Any, session_id: str, run_id: str, worker: Any, **kw: Any) -> Any:
        t, inst = recording_tracer(), instruments()
        if t is None and inst is None:
            return await fn(self, session_id, run_id, worker, **kw)
        with NO_SPAN if t is None else enter_span(t, "claim", **db_attrs("claim"), **{
            SESSION: session_id, "baton.run_id": run_id, "baton.delivery": kw.get("delivery", 1),
        }) as span:
            c = await fn(self, session_id, run_id, worker, **kw)
            if t is not None and span.is_recording():
                span.set_attributes({"baton.claim": c.status, "baton.fence": c.attempt})
                if c.recovering:
                    span.set_attributes({"baton.previous_attempt": c.previous_attempt,
                                         "baton.previous_worker": c.previous_worker})
            if c.status == "claimed" and inst is not None:
                if c.previous_attempt == 0 and c.intent is not None:
                    record_handoff(inst, "dispatch", c.intent.created_ms)
                elif c.recovering and c.previous_worker not in ("", worker.name):
                    inst.takeovers.add(1, {"baton.role": "hands"})
            return c

    return claim  # type: ignore[return-value]


def _record_wake(inst: Any, st: Any) -> None:
    """The wake hop that ends at a look at state ``st``: from the newest completion of the
    results it finds (none: no such hop)."""
    done = [r.completed_ms for r in st.runs.values() if r.status == "completed" and r.completed_ms]
    record_handoff(inst, "wake", max(done) if done else None)


def traced_lease(fn: F) -> F:
    """``Store.acquire_and_load``: span ``lease``; takeovers and the hops that end in a
    Brain's lease (submit -> lease, tool complete -> lease)."""

    @functools.wraps(fn)
    async def acquire_and_load(self: Any, session_id: str, worker: Any, ttl_ms: int,
                               **kw: Any) -> Any:
        t, inst = recording_tracer(), instruments()
        if t is None and inst is None:
            return await fn(self, session_id, worker, ttl_ms, **kw)
        with NO_SPAN if t is None else enter_span(t, "lease", **db_attrs("acquire"),
                                              **{SESSION: session_id}) as span:
            lease, st = await fn(self, session_id, worker, ttl_ms, **kw)
            if t is not None and span.is_recording():
                span.set_attributes({"baton.fence": lease.fence, "baton.takeover": lease.takeover,
                                     "baton.previous_holder": lease.previous_holder})
            if inst is not None:
                if lease.takeover:
                    inst.takeovers.add(1, {"baton.role": "brain"})
                _record_wake(inst, st)
                # A client's submit waits in the inbox until a Brain takes it up: the
                # submit handoff ends at the first lease that sees it there.
                for req in st.requests:
                    if req.submission is not None:
                        record_handoff(inst, "submit", req.submission.created_ms)
            return lease, st

    return acquire_and_load  # type: ignore[return-value]


def traced_recheck(fn: F) -> F:
    """``Store.release_and_load`` (a holder's recheck at the end of its hold, after the
    signal of its results or when the hold ran its length, see baton.brain.held): span
    ``look`` (the recheck's span keeps its first name, which dashboards may query;
    ``baton.heard``: whether the signal came), and the wake hop that ends there (tool
    complete -> the holder's recheck), as :func:`traced_lease` records it for a lease."""

    @functools.wraps(fn)
    async def release_and_load(self: Any, session_id: str, fence: int, ttl_ms: int,
                               **kw: Any) -> Any:
        t, inst = recording_tracer(), instruments()
        if t is None and inst is None:
            return await fn(self, session_id, fence, ttl_ms, **kw)
        with NO_SPAN if t is None else enter_span(t, "look", **db_attrs("release"),
                                              **{SESSION: session_id}) as span:
            st = await fn(self, session_id, fence, ttl_ms, **kw)
            if t is not None and span.is_recording():
                span.set_attributes({"baton.fence": fence, "baton.kept": st is not None})
                end = kw.get("hold_end")
                if end is not None:
                    span.set_attribute("baton.heard", end.heard)
            if inst is not None and st is not None:
                _record_wake(inst, st)
            return st

    return release_and_load  # type: ignore[return-value]


def counted_refusals(op: str) -> Callable[[F], F]:
    """A fenced write without a span of its own (renew, heartbeat): count its refusals."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        async def call(*args: Any, **kw: Any) -> Any:
            try:
                return await fn(*args, **kw)
            except (StaleFenceError, StaleAttemptError) as exc:
                count_refused(instruments(), op, exc)
                raise

        return call  # type: ignore[return-value]

    return decorate
