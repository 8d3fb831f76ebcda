"""The spans and metrics Baton makes: middleware around its few seams, never in task code.

One trace follows a submission across processes::

    submit ─▶ (relay) publish ─▶ brain: process wake ─▶ lease, phase ... ─▶ commit tools
      ─▶ (relay) publish (each) ─▶ hands: process tool ─▶ claim, execute, complete
      ─▶ (relay) publish ─▶ brain: process wake ─▶ lease, phase apply ─▶ commit ...

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
(``db.system.name`` ``redis``, ``db.operation.name`` ``EVALSHA``,
``db.stored_procedure.name`` the script); Baton's own ids are ``baton.*`` (``session_id``,
``fence``, ``run_id``, ``task_id``). Durations are recorded in seconds.

Traces that are not sampled cost almost nothing: under a parent that is not sampled, with
a sampler that follows its parent (the SDK's default and every ``parentbased_*`` sampler),
no span could be recorded, so the wrappers start none (no ids, no sampler call, no
attributes); the consumer makes the message's context current and the writes hand on the
propagation headers it came with (:func:`~baton.observability.telemetry.handing_on`), so
the ``traceparent`` keeps the trace id with the sampled flag off and every process decides
the same way. Counters are tallied in the process (see
:class:`~baton.observability.metrics.Tally`), and so are the histograms under the
MeterProvider Baton's own entry points install
(:class:`~baton.observability.metrics.Histogram`); metric attribute sets are made once.

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

import structlog
from opentelemetry import trace as otel_trace
from opentelemetry.trace import SpanKind, StatusCode

from baton.bus.delivery import delivered
from baton.errors import StaleAttemptError, StaleFenceError
from baton.observability.log import get_logger
from baton.observability.metrics import Instruments
from baton.observability.telemetry import (
    carried,
    carry,
    extract,
    inject,
    instruments,
    set_incoming_trace,
    state,
    trace_id_of,
    tracer,
    uncarry,
    unsampled,
    unsampled_header,
)

__all__ = [
    "advance", "consumer", "counted_refusals", "execute", "publish_span", "publish_spans",
    "sample_backlog", "traced_claim", "traced_commit", "traced_complete", "traced_lease",
    "traced_model", "traced_submit",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

SESSION = "baton.session_id"
NATS = {"messaging.system": "nats"}


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _session_of(msg_id: str) -> str | None:
    """The session of an outbox row id ``<session>/<seq>/<n>`` (the ``Nats-Msg-Id``)."""
    head, _, _n = msg_id.rpartition("/")
    session, _, _seq = head.rpartition("/")
    return session or None


def _db(script: str) -> dict[str, str]:
    """Database attributes of a transition: one Lua script run by ``EVALSHA``."""
    return {"db.system.name": "redis", "db.operation.name": "EVALSHA",
            "db.stored_procedure.name": script}


def _role() -> dict[str, str]:
    return {"baton.role": state.role} if state.role else {}


# Metric attributes are made once per distinct value set and shared by every measurement
# (the SDK only reads them); the sets are few: roles, ops, commit kinds, hops, subjects.


@functools.lru_cache(maxsize=1024)
def _attrs(*pairs: tuple[str, str]) -> dict[str, str]:
    return {k: v for k, v in pairs if v}


def _refused(inst: Instruments | None, op: str, exc: BaseException) -> None:
    if inst is not None:
        inst.refused.add(1, _attrs(("baton.role", state.role), ("baton.op", op), (
            "error.type", getattr(exc, "code", type(exc).__name__))))


def _committed(inst: Instruments | None, op: str, kind: str = "") -> None:
    if inst is not None:
        inst.commits.add(1, _attrs(("baton.role", state.role), ("baton.op", op),
                                   ("baton.commit.kind", kind)))


def _handoff(inst: Instruments, hop: str, since_ms: int | None) -> None:
    if since_ms:
        inst.handoff.record(max(0, _now_ms() - since_ms) / 1000, _attrs(("baton.hop", hop)))


def _traced() -> Any:
    """Baton's tracer, or None when not tracing or when a span started now would certainly
    not be recorded (:func:`~baton.observability.telemetry.unsampled`): the wrappers then
    build no span and no attributes."""
    t = tracer()
    return None if t is None or unsampled() else t


def _handed_on() -> dict[str, str] | None:
    """The propagation headers of the current context (a span of ours or the host's, or an
    unsampled parent's) to hand on with work this process makes no span for, or None when
    no context is current: propagation goes on without spans."""
    kept = carried()
    if kept is not None:  # an unsampled message's headers, as they came
        return dict(kept)
    if otel_trace.get_current_span().get_span_context().is_valid:
        return inject()
    return None


#: Stands in for a span where none is made (``with _NO_SPAN if t is None else _span(...)``):
#: no exit stack on the path taken for nearly every message of an unsampled trace.
_NO_SPAN: Any = contextlib.nullcontext()


def _span(t: Any, name: str, kind: SpanKind = SpanKind.INTERNAL, /, **attributes: Any) -> Any:
    return t.start_as_current_span(
        name, kind=kind, attributes={k: v for k, v in attributes.items() if v is not None})


# ---------------------------------------------------------------------------- publish


def _publish_attrs(subject: str, msg_id: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        **NATS,
        "messaging.destination.name": subject,
        "messaging.message.id": msg_id,
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
    }
    session = _session_of(msg_id)
    if session:
        attrs[SESSION] = session
    return attrs


def _start_publish(t: Any, subject: str, msg_id: str, headers: dict[str, str] | None
                   ) -> tuple[Any, dict[str, str] | None]:
    """A PRODUCER span, child of the context saved in the row (else the current one), and
    the headers to send: the row's, with the publish span's own context.

    No span (None) when the row's context is not sampled: the row's headers go out as they
    are, so the consumer decides from the same sampled flag. A root's attributes are set
    only once it is known to record, when the sampler does not look at them."""
    if unsampled_header(headers):
        return None, headers
    late = state.attribute_free
    span = t.start_span(
        f"publish {subject}", context=extract(headers), kind=SpanKind.PRODUCER,
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
        if span is None:  # not recorded: the item goes out as it is
            items.append(item)
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
        SESSION: _session_of(msg_id) if msg_id else None,
    }
    data = getattr(msg, "data", None)
    if isinstance(data, bytes | bytearray):
        attrs["messaging.message.body.size"] = len(data)
    return {k: v for k, v in attrs.items() if v is not None}


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
                found = processed[subject, error] = _attrs(
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
                inst.redeliveries.add(1, _attrs(("baton.role", role),
                                                ("messaging.destination.name", msg.subject)))
            started = time.perf_counter()
            error: str | None = None
            try:
                if t is None:
                    return await fn(self, msg)
                if unsampled_header(headers):  # not recorded: its context current, no span
                    tokens = carry(headers)  # see telemetry.handing_on
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


# ---------------------------------------------------------------------------- store writes


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
            o if "traceparent" in o.headers
            else o.model_copy(update={"headers": {**o.headers, **carrier}})
            for o in writes.outbox
        ]


def traced_commit(fn: F) -> F:
    """``Store.commit``: span ``commit <kind>``, context saved with the commit; counted."""

    @functools.wraps(fn)
    async def commit(self: Any, session_id: str, fence: int, writes: Any, worker: Any) -> Any:
        t, inst = _traced(), instruments()
        if t is None:
            handed_on = _handed_on()
            if handed_on is not None:  # not recorded here: the trace goes on with the commit
                _stamp(writes, handed_on)
            if inst is None:
                return await fn(self, session_id, fence, writes, worker)
        with _NO_SPAN if t is None else _span(
            t, f"commit {writes.kind}", **_db("commit"), **{
                SESSION: session_id, "baton.fence": fence, "baton.commit.kind": writes.kind,
                "baton.outbox_rows": len(writes.outbox), "baton.tool_runs": len(writes.runs)},
        ) as span:
            if t is not None:
                _stamp(writes, inject())
            try:
                result = await fn(self, session_id, fence, writes, worker)
            except StaleFenceError as exc:
                _refused(inst, "commit", exc)
                raise
            if t is not None and span.is_recording():
                span.set_attribute("baton.seq", int(result[0]))
            _committed(inst, "commit", writes.kind)
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
            t, inst = _traced(), instruments()
            if t is None:
                handed_on = _handed_on()
                if handed_on is not None:  # a context without spans here: handed on all the same
                    kw["headers"] = handed_on
                if inst is None:
                    return await fn(self, session_id, **kw)
            with _NO_SPAN if t is None else _span(
                t, op, SpanKind.PRODUCER, **_db(op), **NATS, **{
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
                    _committed(inst, op)
                return result

        return submit  # type: ignore[return-value]

    return decorate


def traced_complete(fn: F) -> F:
    """``Runs.complete``: span ``complete <tool>``; its context goes with the wake row."""

    @functools.wraps(fn)
    async def complete(self: Any, session_id: str, intent: Any, attempt: int, result: Any,
                       worker: Any, **kw: Any) -> Any:
        t, inst = _traced(), instruments()
        if t is None:
            handed_on = _handed_on()
            if handed_on is not None:  # not recorded here: the trace goes on with the wake
                kw["headers"] = handed_on
            if inst is None:
                return await fn(self, session_id, intent, attempt, result, worker, **kw)
        with _NO_SPAN if t is None else _span(
            t, f"complete {intent.tool}", **_db("complete"), **{
                SESSION: session_id, "baton.run_id": intent.run_id,
                "baton.task_id": intent.task_id, "baton.fence": attempt,
                "baton.outcome": result.outcome, "baton.recovery": result.recovery},
        ) as span:
            if t is not None:
                kw["headers"] = inject()
            try:
                woke = await fn(self, session_id, intent, attempt, result, worker, **kw)
            except StaleAttemptError as exc:
                _refused(inst, "complete", exc)
                raise
            if t is not None and span.is_recording():
                span.set_attribute("baton.woke", bool(woke))
            _committed(inst, "complete")
            return woke

    return complete  # type: ignore[return-value]


def traced_claim(fn: F) -> F:
    """``Runs.claim``: span ``claim``; takeovers and the dispatch hop (commit -> claim)."""

    @functools.wraps(fn)
    async def claim(self: Any, session_id: str, run_id: str, worker: Any, **kw: Any) -> Any:
        t, inst = _traced(), instruments()
        if t is None and inst is None:
            return await fn(self, session_id, run_id, worker, **kw)
        with _NO_SPAN if t is None else _span(t, "claim", **_db("claim"), **{
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
                    _handoff(inst, "dispatch", c.intent.created_ms)
                elif c.recovering and c.previous_worker not in ("", worker.name):
                    inst.takeovers.add(1, {"baton.role": "hands"})
            return c

    return claim  # type: ignore[return-value]


def traced_lease(fn: F) -> F:
    """``Store.acquire_and_load``: span ``lease``; takeovers and the hops that end in a
    Brain's lease (submit -> lease, tool complete -> lease)."""

    @functools.wraps(fn)
    async def acquire_and_load(self: Any, session_id: str, worker: Any, ttl_ms: int,
                               **kw: Any) -> Any:
        t, inst = _traced(), instruments()
        if t is None and inst is None:
            return await fn(self, session_id, worker, ttl_ms, **kw)
        with _NO_SPAN if t is None else _span(t, "lease", **_db("acquire"),
                                              **{SESSION: session_id}) as span:
            lease, st = await fn(self, session_id, worker, ttl_ms, **kw)
            if t is not None and span.is_recording():
                span.set_attributes({"baton.fence": lease.fence, "baton.takeover": lease.takeover,
                                     "baton.previous_holder": lease.previous_holder})
            if inst is not None:
                if lease.takeover:
                    inst.takeovers.add(1, {"baton.role": "brain"})
                done = [r.completed_ms for r in st.runs.values()
                        if r.status == "completed" and r.completed_ms]
                _handoff(inst, "wake", max(done) if done else None)
                # A client's submit waits in the inbox until a Brain takes it up: the
                # submit handoff ends at the first lease that sees it there.
                for req in st.requests:
                    if req.submission is not None:
                        _handoff(inst, "submit", req.submission.created_ms)
            return lease, st

    return acquire_and_load  # type: ignore[return-value]


def counted_refusals(op: str) -> Callable[[F], F]:
    """A fenced write without a span of its own (renew, heartbeat): count its refusals."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        async def call(*args: Any, **kw: Any) -> Any:
            try:
                return await fn(*args, **kw)
            except (StaleFenceError, StaleAttemptError) as exc:
                _refused(instruments(), op, exc)
                raise

        return call  # type: ignore[return-value]

    return decorate


# ---------------------------------------------------------------------------- brain, hands


async def advance(handler: Any, task: Any, ctx: Any) -> Any:
    """One step of a task (the scheduler's call of ``handler.advance``): a span per phase,
    and the task and phase bound to every log line meanwhile."""
    phase = task.checkpoint.phase
    # bind, then reset to what was bound before: structlog's bound_contextvars() does the
    # same after reading every context variable of the context, at every phase.
    tokens = structlog.contextvars.bind_contextvars(task_id=task.id, phase=phase)
    try:
        t = _traced()
        if t is None:
            return await handler.advance(task, ctx)
        with _span(t, f"phase {task.kind}.{phase}", **{
            SESSION: ctx.session_id, "baton.task_id": task.id, "baton.task.kind": task.kind,
            "baton.task.state": task.state.name, "baton.fence": ctx.fence,
        }):
            return await handler.advance(task, ctx)
    finally:
        structlog.contextvars.reset_contextvars(**tokens)


def _provider(name: str) -> str:
    """``gen_ai.provider.name`` from a model name ``<provider>:<model>`` (else the name)."""
    provider, sep, _model = name.partition(":")
    return provider if sep else name


class _TracedModel:
    """A model client whose ``generate`` is a CLIENT span (GenAI semantic conventions) and
    records ``gen_ai.client.operation.duration`` and ``gen_ai.client.token.usage``.

    Always wrapped, checked at each call: a provider configured after the Brain built its
    clients still sees the calls. ``generate`` keeps the wrapped one's signature
    (``functools.wraps``): the Brain looks at it to tell whether the client streams;
    everything else is the client's own.
    """

    def __init__(self, name: str, client: Any) -> None:
        self._client = client
        inner = client.generate
        provider = _provider(name)

        @functools.wraps(inner)
        async def generate(request: Any, *args: Any, **kw: Any) -> Any:
            t, inst = _traced(), instruments()
            if t is None and inst is None:
                return await inner(request, *args, **kw)
            gen_ai = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": provider,
                      "gen_ai.system": provider, "gen_ai.request.model": request.model}
            started = time.perf_counter()
            error: str | None = None
            response: Any = None
            try:
                if t is None:
                    response = await inner(request, *args, **kw)
                    return response
                with _span(t, f"chat {request.model}", SpanKind.CLIENT, **gen_ai, **{
                    "baton.request_id": request.request_id,
                    "baton.entries": len(request.entries),
                }) as span:
                    response = await inner(request, *args, **kw)
                    span.set_attributes({
                        **_usage(response),
                        "gen_ai.response.finish_reasons": [
                            str(getattr(response, "stop_reason", ""))],
                        "baton.tool_calls": len(getattr(response, "tool_calls", ())),
                    })
                    return response
            except BaseException as exc:
                error = type(exc).__name__
                raise
            finally:
                if inst is not None:
                    _record_model(inst, gen_ai, time.perf_counter() - started, response, error)

        self.generate = generate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def _usage(response: Any) -> dict[str, int]:
    usage = getattr(response, "usage", None)
    return {"gen_ai.usage.input_tokens": getattr(usage, "input_tokens", 0),
            "gen_ai.usage.output_tokens": getattr(usage, "output_tokens", 0)}


def _record_model(inst: Instruments, gen_ai: dict[str, Any], seconds: float, response: Any,
                  error: str | None) -> None:
    inst.model_duration.record(seconds, {**gen_ai, "error.type": error} if error else gen_ai)
    if response is not None:
        usage = _usage(response)
        inst.model_tokens.record(usage["gen_ai.usage.input_tokens"],
                                 {**gen_ai, "gen_ai.token.type": "input"})
        inst.model_tokens.record(usage["gen_ai.usage.output_tokens"],
                                 {**gen_ai, "gen_ai.token.type": "output"})


def traced_model(name: str, client: Any) -> Any:
    """The model client ``name``, wrapped so each call is a span when something records."""
    if isinstance(client, _TracedModel):
        return client
    return _TracedModel(name, client)


async def execute(intent: Any, attempt: int, call: Awaitable[T]) -> T:
    """Around deciding a tool run's result (execute, or confirm / re-execute on recovery)."""
    t = _traced()
    if t is None:
        return await call
    with _span(t, f"execute {intent.tool}", **{
        SESSION: intent.session_id, "baton.run_id": intent.run_id,
        "baton.task_id": intent.task_id, "baton.fence": attempt,
        "baton.replay": intent.replay, "baton.operation_id": intent.operation_id,
    }) as span:
        result: Any = await call
        if result is not None:
            span.set_attributes({"baton.outcome": result.outcome,
                                 "baton.recovery": result.recovery})
        return result


# ---------------------------------------------------------------------------- relay


async def sample_backlog(box: Any, stopping: Callable[[float], Awaitable[bool]],
                         every_s: float = 5.0) -> None:
    """Keep the outbox backlog gauge current (the gauge's callback cannot read Redis).

    Reads the backlog only while a MeterProvider is configured; checked at each round.
    """
    while True:
        inst = instruments()
        if inst is not None:
            try:
                now = _now_ms()
                inst.backlog = {
                    str(b.shard): (b.rows, (now - b.oldest_ms) / 1000 if b.oldest_ms else 0.0)
                    for b in await box.backlog()}
            except Exception as exc:  # Redis away: the gauge keeps its last values
                get_logger("baton.relay").debug("backlog_sample_failed",
                                                          error=repr(exc))
        if await stopping(every_s):
            return
