"""How a trace is handed on from message to message: the W3C context in NATS headers.

A process that handles a message makes its span a child of the context the message carries
(:func:`extract`), and the messages it sends carry its own (:func:`inject`). A message whose
trace is not sampled is handled under its context without a span (:func:`handing_on`): its
headers are handed on as they came, so the next process decides the same way without the
propagators' work. Log lines name the trace of the message being handled
(:func:`current_trace_id`), traced here or not.

The propagators are the global ones of the OpenTelemetry API (``OTEL_PROPAGATORS``; W3C
``tracecontext`` and ``baggage`` by default), and the sampler's traits come from
:data:`baton.observability.otel_state.state`, which :mod:`baton.observability.telemetry`
keeps.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import re
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.context import Context

from baton.observability.otel_state import state

# Importing the propagation API loads the propagators OTEL_PROPAGATORS names, and fails for
# one that is not installed: every command would fail with it, tracing or not. Then no
# context is handed on, and telemetry.setup() refuses to trace with a clear error.
_no_propagators = ""
try:
    from opentelemetry import propagate
except ValueError as exc:
    propagate: Any = None  # type: ignore[no-redef]
    _no_propagators = str(exc)

__all__ = [
    "carried", "carries_context", "carry", "current_trace_id", "dropped_root", "extract",
    "handing_on", "inject", "no_propagators", "propagators_loaded", "set_incoming_trace",
    "trace_id_of", "uncarry", "unsampled", "unsampled_header",
]

_NO_TRACE = "0" * 32

# The trace id of the message being handled when this process does not trace itself (taken
# from its traceparent header), so log lines still name the trace they belong to.
_incoming_trace: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "baton_incoming_trace", default=None)

# While a message whose trace is not sampled is handled (handing_on): the context made
# current for it and the propagation headers it came with, handed on as they are.
_carried: contextvars.ContextVar[tuple[Context, dict[str, str]] | None] = (
    contextvars.ContextVar("baton_carried", default=None))


def unsampled(context: Context | None = None) -> bool:
    """Whether a span started now (under ``context``, else the current one) is certain not
    to be recorded: its parent is valid and not sampled, and the sampler follows parents.

    The wrappers then start no span at all: no ids, no sampler call, no attributes. The
    parent's context stays current, so the W3C ``traceparent`` handed on names the same
    trace with the sampled flag off, and the next process decides the same way.
    """
    if not state.follows_parent:
        return False
    if context is None:
        found = _carried.get()  # carried(), inlined: asked by every wrapper
        if found is not None and otel_context.get_current() is found[0]:
            return True
    ctx = otel_trace.get_current_span(context).get_span_context()
    return ctx.is_valid and not ctx.trace_flags.sampled


def carried() -> dict[str, str] | None:
    """The propagation headers of the unsampled message being handled (:func:`handing_on`),
    while its context is still the current one; else None."""
    found = _carried.get()
    if found is not None and otel_context.get_current() is found[0]:
        return found[1]
    return None


@functools.lru_cache(maxsize=8)
def _fields(textmap: Any) -> tuple[str, ...]:
    return tuple(sorted(textmap.fields))


_W3C = ("baggage", "traceparent", "tracestate")  # the default propagators' fields
_VERSION_00 = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


@contextlib.contextmanager
def handing_on(headers: Mapping[str, str]) -> Iterator[None]:
    """Handle a message whose trace is not sampled (:func:`unsampled_header`) under its
    context, which hands the trace on without a span (:func:`carry` and :func:`uncarry`).

    The context is made current, so a span started under it (instrumented code in a tool)
    is not sampled either; the propagation headers the message came with are kept, so
    :func:`inject` hands the same ones on without formatting them again and
    :func:`unsampled` answers without looking the span up. The SDK's propagators would
    write the same: the parent and flags of ``traceparent``, ``tracestate`` and
    ``baggage`` are passed on unchanged by a process that makes no span.
    """
    tokens = carry(headers)
    try:
        yield
    finally:
        uncarry(tokens)


def carry(headers: Mapping[str, str]) -> tuple[Any, Any]:
    """Enter :func:`handing_on` (without a generator: once per handled message); the
    tokens to give :func:`uncarry`."""
    if propagate is None:
        found = (Context(), {})
        return otel_context.attach(found[0]), _carried.set(found)
    fields = _fields(propagate.get_global_textmap())
    found = None
    if fields == _W3C and "tracestate" not in headers and "baggage" not in headers:
        traceparent = headers.get("traceparent")
        if traceparent is not None:
            found = _plain_carried(traceparent)
    if found is None:
        kept = {k: headers[k] for k in fields if k in headers}
        found = (extract(headers) or Context(), kept)
    return otel_context.attach(found[0]), _carried.set(found)


@functools.lru_cache(maxsize=1024)
def _plain_carried(traceparent: str) -> tuple[Context, dict[str, str]] | None:
    """What :func:`carry` keeps for a lone version-00 ``traceparent``: the context the
    default propagators would extract, made without them, and the headers to hand on; None
    for anything else. Made once per trace: the messages of a session that is not sampled
    carry the same ``traceparent`` (contexts are immutable and the headers only read, so
    they share them)."""
    match = _VERSION_00.fullmatch(traceparent)
    if match is None:
        return None
    trace_id, span_id, flags = (int(g, 16) for g in match.groups())
    if not trace_id or not span_id:
        return None
    ctx = otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(otel_trace.SpanContext(
        trace_id=trace_id, span_id=span_id, is_remote=True,
        trace_flags=otel_trace.TraceFlags(flags))))
    return ctx, {"traceparent": traceparent}


def uncarry(tokens: tuple[Any, Any]) -> None:
    token, mark = tokens
    _carried.reset(mark)
    otel_context.detach(token)


def dropped_root(name: str, kind: Any) -> str | None:
    """The ``traceparent`` of a new trace the sampler drops, made without a span (see
    :mod:`baton.observability.roots`), for a span ``name`` that would start one now: None
    when the sampler keeps it, when something is current (a span or baggage the
    propagators would hand on), or when the tracer is not the one that
    :func:`~baton.observability.telemetry.setup` installed with a sampler that decides on
    trace ids alone. Then start the span as usual."""
    roots = state.roots
    if (roots is None or propagate is None or otel_context.get_current()
            or _fields(propagate.get_global_textmap()) != _W3C):
        return None
    return roots(name, kind)


def unsampled_header(headers: Mapping[str, str] | None) -> bool:
    """:func:`unsampled` for a message's headers, read from ``traceparent`` without parsing
    the whole context (``00-<trace id>-<span id>-<flags>``)."""
    if not state.follows_parent or not headers:
        return False
    value = headers.get("traceparent")
    if not value or len(value) != 55 or value[2] != "-" or value[3:35] == _NO_TRACE:
        return False
    try:
        return not int(value[53:55], 16) & 1
    except ValueError:
        return False


def inject(carrier: dict[str, str] | None = None, context: Context | None = None
           ) -> dict[str, str]:
    """The W3C trace context (``traceparent``, ``tracestate``) of the current span."""
    carrier = {} if carrier is None else carrier
    kept = carried() if context is None else None
    if kept is not None:  # an unsampled message's headers, as they came
        carrier.update(kept)
        return carrier
    if propagate is not None:
        propagate.inject(carrier, context=context)
    return carrier


def carries_context(headers: Mapping[str, str] | None) -> bool:
    """Whether ``headers`` hold a trace context the configured propagators read: a
    ``traceparent`` under the default ones, any of their fields under others (``b3``)."""
    if not headers or propagate is None:
        return False
    if "traceparent" in headers:
        return True
    fields = _fields(propagate.get_global_textmap())
    return fields != _W3C and any(f in headers for f in fields)


def extract(headers: Mapping[str, str] | None) -> Context | None:
    """The context carried in message headers; None when they carry none."""
    if not carries_context(headers):
        return None
    return propagate.extract(headers)


def trace_id_of(headers: Mapping[str, str] | None) -> str | None:
    """The trace id in a ``traceparent`` header (``00-<trace id>-<span id>-<flags>``), or
    in the headers of the propagators configured instead (``b3``)."""
    if not headers:
        return None
    value = headers.get("traceparent")
    if value:
        return value[3:35] if len(value) >= 55 and value[2] == "-" else None
    if not carries_context(headers):
        return None
    ctx = otel_trace.get_current_span(propagate.extract(headers)).get_span_context()
    return f"{ctx.trace_id:032x}" if ctx.is_valid else None


def set_incoming_trace(trace_id: str | None) -> None:
    """Remember the handled message's trace id for log lines (when not tracing here)."""
    _incoming_trace.set(trace_id)


def current_trace_id() -> str | None:
    """The trace id log lines carry: the current span's, else the handled message's."""
    ctx = otel_trace.get_current_span().get_span_context()
    if ctx.is_valid:
        return f"{ctx.trace_id:032x}"
    return _incoming_trace.get()


def propagators_loaded() -> bool:
    """Whether the propagators ``OTEL_PROPAGATORS`` names could be loaded."""
    return propagate is not None


def no_propagators() -> str:
    """Why they could not be (the API's error), or ""."""
    return _no_propagators
