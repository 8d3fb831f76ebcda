"""The spans and metrics Baton makes: middleware around its few seams, never in task code.

One trace follows a submission across processes::

    submit ─▶ (relay) publish ─▶ brain: process wake ─▶ lease, phase ... ─▶ commit tools
      ─▶ (relay) publish (each) ─▶ hands: process tool ─▶ claim, execute, complete
      ─▶ (relay) publish ─▶ brain: process wake ─▶ lease, phase apply ─▶ commit ...
                  (or, to a Brain holding its lease, the completion's signal on its hold
                   channel ─▶ brain: process held ─▶ look (the recheck), phase apply ...)

How the context travels: a write that hands work over (:func:`traced_submit`,
:func:`traced_commit`, :func:`traced_complete` around the :class:`~baton.store.store.Store`
methods) saves the W3C context of its own span in the outbox rows it writes, in the receipt
(``Receipt.trace``) and in each tool run it creates (``ToolIntent.trace``). The relay's
publish span (:func:`publish_spans`, in :class:`~baton.bus.bus.Bus`) is a child of the context
saved in the row, and replaces ``traceparent`` with its own in the NATS headers; the
consumer's span (:func:`consumer`) is a child of that. A message redelivered to another
process after a crash carries the same headers, and a tool message sent again by the Brain
(a stuck run) carries the context saved in the run's intent, so a takeover stays in the
trace of the work it takes over. Timer wakes carry no context: they start a trace of their
own (with ``baton.session_id`` like every span, to find them).

The relay publishes a batch with one PRODUCER span per row, all ended when the batch's acks
are in: rows of a batch belong to different sessions (different traces), so a batch span
with links would leave each trace without the hop that carried it.

Span names and attributes follow the semantic conventions: messaging for publish and
consume (``messaging.system`` ``nats``, ``messaging.destination.name`` the subject,
``messaging.message.id`` the ``Nats-Msg-Id``, ``messaging.operation.type`` ``create`` /
``send`` / ``process``, ``messaging.consumer.group.name`` the durable consumer), GenAI for
the model call (``gen_ai.*``), database for the Redis scripts behind a transition
(``db.system.name`` ``redis``, ``db.operation.name`` ``FCALL``,
``db.stored_procedure.name`` the script); Baton's own ids are ``baton.*`` (``session_id``,
``fence``, ``run_id``, ``task_id``). Durations are recorded in seconds.

Traces that are not sampled cost almost nothing: under a parent that is not sampled, with
a sampler that follows its parent (the SDK's default and every ``parentbased_*`` sampler),
no span could be recorded, so the wrappers start none (no ids, no sampler call, no
attributes); the consumer makes the message's context current and the writes hand on the
propagation headers it came with (:func:`~baton.observability.propagation.handing_on`), so
the ``traceparent`` keeps the trace id with the sampled flag off and every process decides
the same way. Counters are tallied in the process (see
:class:`~baton.observability.metrics.Tally`), and so are the histograms under the
MeterProvider Baton's own entry points install
(:class:`~baton.observability.metrics.Histogram`); metric attribute sets are made once.

Here are the publish and consume seams; the store's writes are wrapped in
:mod:`~baton.observability.traced_store`, the model calls and tool executions in
:mod:`~baton.observability.traced_work`, a task's phases where the scheduler calls them
(:func:`baton.brain.scheduler.advance`), and what they all share is in
:mod:`~baton.observability.spans` (every name but ``advance`` still imports from here).

The tracer and instruments come from the global providers at use time
(:func:`baton.observability.telemetry.tracer` / ``instruments``): the host application's,
or those Baton's own entry point installed. With none configured every wrapper calls
straight through.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

from opentelemetry import trace as otel_trace
from opentelemetry.trace import SpanKind, StatusCode

from baton.bus.delivery import delivered
from baton.observability.log import error_text, get_logger
from baton.observability.otel_state import state
from baton.observability.propagation import (
    carry,
    dropped_root,
    extract,
    inject,
    set_incoming_trace,
    trace_id_of,
    uncarry,
    unsampled_header,
)
from baton.observability.spans import (
    NATS,
    SESSION,
    metric_attrs,
    now_ms,
    session_of,
)
from baton.observability.telemetry import instruments, tracer
from baton.observability.traced_store import (
    counted_refusals,
    traced_claim,
    traced_commit,
    traced_complete,
    traced_lease,
    traced_recheck,
    traced_submit,
)
from baton.observability.traced_work import execute, traced_model

__all__ = [
    "consumer",
    "counted_refusals",
    "execute",
    "publish_span",
    "publish_spans",
    "recheck_span",
    "sample_backlog",
    "traced_claim",
    "traced_commit",
    "traced_complete",
    "traced_lease",
    "traced_model",
    "traced_recheck",
    "traced_submit",
    "work_backlog",
]

F = TypeVar("F", bound=Callable[..., Any])


# ---------------------------------------------------------------------------- publish


def _publish_attrs(subject: str, msg_id: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        **NATS,
        "messaging.destination.name": subject,
        "messaging.message.id": msg_id,
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
    }
    session = session_of(msg_id)
    if session:
        attrs[SESSION] = session
    return attrs


def _start_publish(t: Any, subject: str, msg_id: str, headers: dict[str, str] | None
                   ) -> tuple[Any, dict[str, str] | None]:
    """A PRODUCER span, child of the context saved in the row (else the current one), and
    the headers to send: the row's, with the publish span's own context.

    No span (None) when the row's context is not sampled: the row's headers go out as they
    are, so the consumer decides from the same sampled flag. A new trace the sampler drops
    gets only its ``traceparent`` (:func:`~baton.observability.propagation.dropped_root`). A
    root's attributes are set only once it is known to record, when the sampler does not
    look at them."""
    if unsampled_header(headers):
        return None, headers
    name, parent = f"publish {subject}", extract(headers)
    if parent is None:  # a new trace: most of them dropped by the sampler, made without a span
        root = dropped_root(name, SpanKind.PRODUCER)
        if root is not None:
            return None, {**(headers or {}), "traceparent": root}
    late = state.attribute_free
    span = t.start_span(
        name, context=parent, kind=SpanKind.PRODUCER,
        attributes=None if late else _publish_attrs(subject, msg_id))
    if late and span.is_recording():
        span.set_attributes(_publish_attrs(subject, msg_id))
    out = dict(headers or {})
    inject(out, otel_trace.set_span_in_context(span))
    return span, out


def _end(spans: Sequence[Any], exc: BaseException | None) -> None:
    for span in spans:
        if span is None:
            continue
        if exc is not None:
            span.record_exception(exc)
            span.set_status(StatusCode.ERROR, repr(exc))
        span.end()


@contextlib.contextmanager
def publish_span(subject: str, msg_id: str, headers: dict[str, str] | None
                 ) -> Iterator[dict[str, str] | None]:
    """Around one publish: yields the headers to send (the same ones when not tracing)."""
    t = tracer()
    if t is None:
        yield headers
        return
    span, out = _start_publish(t, subject, msg_id, headers)
    try:
        yield out
    except BaseException as exc:
        _end([span], exc)
        raise
    _end([span], None)


@contextlib.contextmanager
def publish_spans(batch: list[Any]) -> Iterator[list[Any]]:
    """Around a concurrent publish of :class:`~baton.bus.messages.Outgoing` items: one span
    per item, all ended when the batch is acknowledged (or failed); yields the items to
    send."""
    t = tracer()
    if t is None:
        yield batch
        return
    spans, items = [], []
    for item in batch:
        span, headers = _start_publish(t, item.subject, item.msg_id, item.headers)
        if span is None:  # not recorded: the item goes out with its trace's headers
            items.append(item if headers is item.headers else item._replace(headers=headers))
            continue
        spans.append(span)
        items.append(item._replace(headers=headers))
    try:
        yield items
    except BaseException as exc:
        _end(spans, exc)
        raise
    _end(spans, None)


# ---------------------------------------------------------------------------- consume


def _consume_attrs(msg: Any, role: str, delivery: int) -> dict[str, Any]:
    msg_id = (msg.headers or {}).get("Nats-Msg-Id", "")
    attrs: dict[str, Any] = {
        **NATS,
        "messaging.destination.name": msg.subject,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": msg_id or None,
        "messaging.consumer.group.name": getattr(getattr(msg, "metadata", None), "consumer",
                                                 None),
        "baton.delivery": delivery,
        "baton.role": role,
        SESSION: session_of(msg_id) if msg_id else None,
    }
    data = getattr(msg, "data", None)
    if isinstance(data, bytes | bytearray):
        attrs["messaging.message.body.size"] = len(data)
    return {k: v for k, v in attrs.items() if v is not None}


@contextlib.contextmanager
def recheck_span(session_id: str, channel: str, headers: dict[str, str] | None) -> Iterator[None]:
    """Around a holder's recheck after the signal of its results (baton.brain.held): a
    CONSUMER span ``process <channel>``, child of the completion's context the signal carried (the
    Hands' ``complete``), so the trace runs Hands -> Brain without the relay's publish in
    between; under an unsampled context, that context made current, as :func:`consumer`
    does for a message. Without telemetry it only notes the trace id for log lines."""
    t = tracer()
    if t is None:
        set_incoming_trace(trace_id_of(headers) if headers else None)
        yield
        return
    if headers and unsampled_header(headers):
        tokens = carry(headers)
        try:
            yield
        finally:
            uncarry(tokens)
        return
    with t.start_as_current_span(
        f"process {channel}", context=extract(headers or {}), kind=SpanKind.CONSUMER,
        attributes={"messaging.system": "redis", "messaging.destination.name": channel,
                    "messaging.operation.type": "process", "messaging.operation.name": "process",
                    "baton.role": "brain", SESSION: session_id},
    ):
        yield


@contextlib.asynccontextmanager
async def waiting_for_slot(tool: str) -> Any:
    """Around a tool run's wait in its tool's fleet-wide line (baton.store.limits): an
    INTERNAL span ``wait for <tool> slot`` under the message's CONSUMER span, so a trace
    shows where a run waited and how long. Yields a setter for the place it got in line.
    Nothing without telemetry or under an unsampled trace."""
    t = tracer()
    parent = otel_trace.get_current_span()
    if t is None or not parent.is_recording():
        yield lambda position: None
        return
    with t.start_as_current_span(f"wait for {tool} slot", kind=SpanKind.INTERNAL,
                                 attributes={"baton.tool": tool}) as span:
        yield lambda position: span.set_attribute("baton.limit.position", position)


@contextlib.asynccontextmanager
async def waiting_for_budget(model: str) -> Any:
    """Around a model call's wait in its model's fleet-wide budget (baton.store.budgets): an
    INTERNAL span ``wait for <model> budget`` before the call's own span, so a trace shows
    where a call waited, for what and how long. Yields a setter for the place it got in line
    and what it waits for. Nothing without telemetry or under an unsampled trace."""
    t = tracer()
    parent = otel_trace.get_current_span()
    if t is None or not parent.is_recording():
        yield lambda position, waiting_for: None
        return
    with t.start_as_current_span(f"wait for {model} budget", kind=SpanKind.INTERNAL,
                                 attributes={"gen_ai.request.model": model}) as span:
        yield lambda position, waiting_for: span.set_attributes(
            {"baton.limit.position": position, "baton.limit.waiting_for": waiting_for})


def consumer(role: str) -> Callable[[F], F]:
    """Decorator of a worker's per-message handler ``handle(self, msg)``: a CONSUMER span
    (``process <subject>``), child of the context in the message's headers; counts
    redeliveries and records ``messaging.process.duration``. Without telemetry it only
    notes the message's trace id for log lines."""

    def decorate(fn: F) -> F:
        processed: dict[tuple[str, str], dict[str, str]] = {}  # (subject, error) -> attributes

        def process_attrs(subject: str, error: str) -> dict[str, str]:
            found = processed.get((subject, error))
            if found is None:
                if len(processed) >= 1024:
                    processed.clear()
                found = processed[subject, error] = metric_attrs(
                    ("messaging.system", "nats"), ("messaging.destination.name", subject),
                    ("messaging.operation.name", "process"), ("baton.role", role),
                    ("error.type", error))
            return found

        @functools.wraps(fn)
        async def handle(self: Any, msg: Any) -> Any:
            headers = msg.headers
            t, inst = tracer(), instruments()
            if t is None:
                set_incoming_trace(trace_id_of(headers) if headers else None)
                if inst is None:
                    return await fn(self, msg)
            try:
                delivery = delivered(msg)
            except Exception:  # not a JetStream message (tests): first delivery
                delivery = 1
            if delivery > 1 and inst is not None:
                inst.redeliveries.add(1, metric_attrs(("baton.role", role),
                                                ("messaging.destination.name", msg.subject)))
            started = time.perf_counter()
            error: str | None = None
            try:
                if t is None:
                    return await fn(self, msg)
                if unsampled_header(headers):  # not recorded: its context current, no span
                    tokens = carry(headers)  # see propagation.handing_on
                    try:
                        return await fn(self, msg)
                    finally:
                        uncarry(tokens)
                with t.start_as_current_span(
                    f"process {msg.subject}", context=extract(headers),
                    kind=SpanKind.CONSUMER, attributes=_consume_attrs(msg, role, delivery),
                ):
                    return await fn(self, msg)
            except BaseException as exc:
                error = type(exc).__name__
                raise
            finally:
                if inst is not None:
                    inst.process.record(time.perf_counter() - started,
                                        process_attrs(msg.subject, error or ""))

        return handle  # type: ignore[return-value]

    return decorate


# ---------------------------------------------------------------------------- relay


async def sample_backlog(box: Any, stopping: Callable[[float], Awaitable[bool]],
                         every_s: float = 5.0, unmetered_s: float = 60.0,
                         work: Callable[[], Awaitable[dict[tuple[str, str, str], int]]]
                         | None = None) -> None:
    """Keep the backlog gauges current (the gauges' callbacks cannot read Redis or NATS).

    Reads the outbox backlog, and with ``work`` (the relay's :func:`work_backlog`) the work
    waiting for Brains and Hands, every ``every_s`` while a MeterProvider is configured;
    checked at each round, every ``unmetered_s`` while none is (an idle relay without
    metrics need not wake to find nothing to do: a ``baton relay``'s provider is set before
    it starts). A series once seen stays, at 0 when its work is gone: a gauge that stopped
    reporting would read as unknown, not as nothing waiting.
    """
    told: set[str] = set()  # the kinds of failure already logged at WARNING
    while True:
        inst = instruments()
        if inst is not None:
            try:
                now = now_ms()
                inst.backlog = {
                    str(b.shard): (b.rows, (now - b.oldest_ms) / 1000 if b.oldest_ms else 0.0)
                    for b in await box.backlog()}
                if work is not None:
                    found = await work()
                    inst.work = {**dict.fromkeys(inst.work, 0), **found}
            except Exception as exc:  # Redis or NATS away: the gauges keep their last values
                # The first failure of a kind is a WARNING (a refused command is a
                # configuration to fix, and the gauges stay empty until it is); repeats of
                # it, as a Redis away retried every few seconds, are DEBUG.
                kind = type(exc).__name__
                log = get_logger("baton.relay")
                (log.debug if kind in told else log.warning)(
                    "backlog_sample_failed", error=error_text(exc),
                    effect="the backlog gauges keep their last values")
                told.add(kind)
        if await stopping(every_s if inst is not None else unmetered_s):
            return


async def work_backlog(js: Any, names: Any, admission: Any) -> dict[tuple[str, str, str], int]:
    """``(stream, consumer, tenant) -> waiting`` for the ``baton.backlog`` gauge: each
    durable consumer's messages not yet acked (:func:`baton.bus.backlog.consumer_backlog`,
    tenant "") and each tenant's new sessions waiting for admission
    (:meth:`baton.store.admission.AdmissionQueue.tenants`, stream "admission")."""
    from baton.bus.backlog import consumer_backlog

    found = {(stream, consumer, ""): n
             for (stream, consumer), n in (await consumer_backlog(js, names)).items()}
    for tenant, n in (await admission.tenants()).items():
        found[("admission", "", tenant)] = n
    return found
