"""OpenTelemetry the way a library does it: Baton records through the global API only.

Every span and metric Baton makes goes through ``trace.get_tracer("baton", version)`` and
``metrics.get_meter("baton", version)``, looked up at use time (:func:`tracer`,
:func:`instruments`). So an application that embeds Baton (a web app calling
``Client.submit``) and has configured its own TracerProvider / MeterProvider records Baton's
spans with its own, and its current span is the parent of the submit: the W3C context saved
with the submission carries the host's trace id on to the relay, the Brains and the Hands.
Importing or using Baton never installs a provider, and this module never imports the SDK
outside :func:`setup`. With no provider configured, :func:`tracer` and :func:`instruments`
return None after one look at the global provider, and every wrapper in
:mod:`baton.observability.tracing` calls straight through: no span, context or header.

:func:`setup` is for Baton's own entry points only (``baton brain|hands|relay|submit|start``):
it installs the global providers from the standard ``OTEL_*`` variables, and
:func:`shutdown` flushes at exit. What it reads (the exporters are chosen by
:mod:`baton.observability.exporters`):

* traces: an OTLP (http/protobuf) exporter when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set; ``OTEL_TRACES_EXPORTER`` may name
  ``otlp``, ``console`` (to stderr) or ``none`` explicitly. ``OTEL_SERVICE_NAME``,
  ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*`` and the exporter's
  own variables (headers, timeout, ...) are honoured by the SDK; ``OTEL_SDK_DISABLED=true``
  turns everything off.
* metrics: the same, with ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` / ``OTEL_METRICS_EXPORTER``
  (every ``OTEL_METRIC_EXPORT_INTERVAL``, 60 s by default). Under this MeterProvider the
  counters and histograms are aggregates kept in the process
  (:mod:`baton.observability.metrics`) and added to each export with the names, units,
  buckets and attributes the SDK's would have.
* ``BATON_OTEL_FILE=PATH`` (ours, for tests): every finished span as one JSON line appended
  to PATH as it ends (:mod:`baton.observability.span_file`), so the spans of several
  processes (even one SIGKILLed) can be merged.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import functools
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace
from opentelemetry.context import Context
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.metrics import _internal as _metrics_api
from opentelemetry.metrics._internal import _ProxyMeterProvider
from opentelemetry.trace import NoOpTracer, NoOpTracerProvider, ProxyTracerProvider

from baton.errors import ConfigError
from baton.observability import exporters
from baton.observability.exporters import FILE_ENV
from baton.observability.metrics import (
    Histogram,
    Instruments,
    Tally,
    kept_histograms_exporter,
)
from baton.observability.span_file import JsonLinesSpanExporter

# Importing the propagation API loads the propagators OTEL_PROPAGATORS names, and fails for
# one that is not installed: every command would fail with it, tracing or not. Then no
# context is handed on, and setup() refuses to trace with a clear error.
_no_propagators = ""
try:
    from opentelemetry import propagate
except ValueError as exc:
    propagate: Any = None  # type: ignore[no-redef]
    _no_propagators = str(exc)

__all__ = [
    "FILE_ENV", "SCOPE", "Histogram", "Instruments", "JsonLinesSpanExporter", "Tally",
    "carries_context", "carry", "current_trace_id", "dropped_root", "extract", "handing_on",
    "inject", "instruments", "setup", "shutdown", "state", "trace_id_of", "tracer", "uncarry",
    "unsampled", "unsampled_header",
]

SCOPE = "baton"  # the instrumentation scope of every span and instrument Baton makes

# The global providers that mean "nobody configured telemetry": the API's proxies (before
# any set_*_provider) and the explicit no-ops.
_NO_TRACING = (ProxyTracerProvider, NoOpTracerProvider)
_NO_METRICS = (_ProxyMeterProvider, NoOpMeterProvider)


class _State:
    """What this process knows about telemetry.

    ``role`` and the exporters to flush exist only when an entry point called :func:`setup`.
    The rest is a cache of Baton's tracer and instruments for the global providers last
    seen, re-made when a provider changes (a host may configure its own after import).
    """

    def __init__(self) -> None:
        self.role = ""
        self.installed = False
        self._shutdown: list[Callable[[], Any]] = []
        self.tracer_provider: object = None
        self.tracer: Any = None
        # What the provider's sampler is known to do (see _sampler_traits): a child of a
        # span that is not sampled is not sampled either; the root decision ignores
        # attributes. Both False for a sampler this module does not know.
        self.follows_parent = False
        self.attribute_free = False
        # The TracerProvider setup() installed, and the maker of the roots its sampler
        # drops (baton.observability.roots); ``roots`` is that maker while the provider is
        # the global one and its sampler decides on trace ids alone, else None.
        self.own_tracer_provider: object = None
        self.own_roots: Callable[[str, Any], str | None] | None = None
        self.roots: Callable[[str, Any], str | None] | None = None
        self.meter_provider: object = None
        self.instruments: Instruments | None = None
        # The MeterProvider setup() installed, and the histograms its exporters add.
        self.own_meter_provider: object = None
        self.kept: list[Histogram] = []
        # How long shutdown() waits for the exporters (Settings.telemetry_flush_timeout_s).
        self.flush_timeout_s = 3.0


state = _State()

# The trace id of the message being handled when this process does not trace itself (taken
# from its traceparent header), so log lines still name the trace they belong to.
_incoming_trace: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "baton_incoming_trace", default=None)

# While a message whose trace is not sampled is handled (handing_on): the context made
# current for it and the propagation headers it came with, handed on as they are.
_carried: contextvars.ContextVar[tuple[Context, dict[str, str]] | None] = (
    contextvars.ContextVar("baton_carried", default=None))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("baton")
    except PackageNotFoundError:  # run from a source tree without an install
        return "0"


def _unset(api: Any, name: str, env: str) -> bool:
    """Whether no global provider is set: the fast path of every wrapper.

    ``get_tracer_provider()`` / ``get_meter_provider()`` look the environment up on every
    call until a provider is set (microseconds, several times per handled message); the
    API module's global answers the same question in tens of nanoseconds. Should a future
    API drop that global, this falls back to the public call.
    """
    return getattr(api, name, False) is None and not _provider_in_env(env)


@functools.cache
def _provider_in_env(env: str) -> bool:
    """A provider named by the API's own variable, loaded on the first public call."""
    return env in os.environ


def tracer() -> Any:
    """Baton's tracer from the global TracerProvider; None when no provider is configured.

    Called by every wrapper at use time: one look at the global provider, and a new tracer
    only when the provider changed.
    """
    provider: Any = getattr(otel_trace, "_TRACER_PROVIDER", None)
    if provider is not None and provider is state.tracer_provider:  # the usual case
        return state.tracer
    if _unset(otel_trace, "_TRACER_PROVIDER", "OTEL_PYTHON_TRACER_PROVIDER"):
        return None
    provider = otel_trace.get_tracer_provider()  # new, or named by the environment
    if provider is not state.tracer_provider:
        found: Any = None
        if not isinstance(provider, _NO_TRACING):
            found = provider.get_tracer(SCOPE, _version())
            if isinstance(found, NoOpTracer):  # an SDK provider disabled by OTEL_SDK_DISABLED
                found = None
        state.follows_parent, state.attribute_free = _sampler_traits(provider)
        state.roots = (state.own_roots if provider is state.own_tracer_provider
                       and state.attribute_free else None)
        state.tracer, state.tracer_provider = found, provider
    return state.tracer


_NO_TRACE = "0" * 32

#: Samplers whose decision does not depend on a span's name, kind or attributes.
_PLAIN_SAMPLERS = ("AlwaysOnSampler", "AlwaysOffSampler", "TraceIdRatioBased{")


def _sampler_traits(provider: Any) -> tuple[bool, bool]:
    """(follows its parent, decides roots without attributes) for the provider's sampler.

    Read from the SDK sampler's description (no SDK import): ``ParentBased{root:...,
    remoteParentNotSampled:AlwaysOffSampler,...,localParentNotSampled:AlwaysOffSampler}``
    for the SDK's default and the ``parentbased_*`` samplers of ``OTEL_TRACES_SAMPLER``.
    Any other sampler (a host's own) gets neither, and every span is started as usual.
    """
    try:
        description = str(provider.sampler.get_description())
    except Exception:  # not the SDK's provider, or no sampler
        return False, False
    follows = ("remoteParentNotSampled:AlwaysOffSampler" in description
               and "localParentNotSampled:AlwaysOffSampler" in description)
    root = description.removeprefix("ParentBased{root:")
    return follows, root.startswith(_PLAIN_SAMPLERS)


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
    propagators would hand on), or when the tracer is not the one :func:`setup` installed
    with a sampler that decides on trace ids alone. Then start the span as usual."""
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


def instruments() -> Instruments | None:
    """Baton's instruments on the global MeterProvider; None when no provider is configured."""
    provider: Any = getattr(_metrics_api, "_METER_PROVIDER", None)
    if provider is not None and provider is state.meter_provider:  # the usual case
        return state.instruments
    if _unset(_metrics_api, "_METER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER"):
        return None
    provider = otel_metrics.get_meter_provider()  # new, or named by the environment
    if provider is not state.meter_provider:
        found = None
        if not isinstance(provider, _NO_METRICS):
            own = provider is state.own_meter_provider
            found = Instruments.create(provider.get_meter(SCOPE, _version()),
                                       state.kept if own else None)
        state.instruments, state.meter_provider = found, provider
    return state.instruments


# ---------------------------------------------------------------------------- set up


def setup(service_name: str, settings: Any = None,
          env: Mapping[str, str] | None = None) -> bool:
    """Install global providers with exporters from the environment; True when it did.

    For Baton's own entry points only: a library must not decide where its host's telemetry
    goes. ``service_name`` is the role (``brain``, ``hands``, ``relay``, ``client``): the
    service is ``baton-<role>`` unless ``OTEL_SERVICE_NAME`` (or ``service.name`` in
    ``OTEL_RESOURCE_ATTRIBUTES``) says otherwise. A provider that is already global (set by
    ``OTEL_PYTHON_TRACER_PROVIDER``, or by code that ran first) is kept. Idempotent.
    """
    env = os.environ if env is None else env
    state.role = state.role or service_name
    if settings is not None:
        state.flush_timeout_s = settings.telemetry_flush_timeout_s
    if state.installed or exporters.truthy(env.get("OTEL_SDK_DISABLED")):
        return state.installed
    unset_traces = isinstance(otel_trace.get_tracer_provider(), _NO_TRACING)
    unset_metrics = isinstance(otel_metrics.get_meter_provider(), _NO_METRICS)
    span_exporters = exporters.span_exporters(env) if unset_traces else []
    if span_exporters and propagate is None:
        raise ConfigError(f"OTEL_PROPAGATORS: {_no_propagators} Install its package, or "
                          "leave OTEL_PROPAGATORS unset (W3C tracecontext and baggage).")
    metric_exporters = exporters.metric_exporters(env) if unset_metrics else []
    if not span_exporters and not metric_exporters:
        return False

    from opentelemetry.sdk.resources import OTELResourceDetector, Resource

    ours: dict[str, Any] = {
        "service.name": service_name if "-" in service_name else f"baton-{service_name}",
        "service.namespace": "baton",
        "process.pid": os.getpid(),
    }
    if settings is not None:
        ours["service.instance.id"] = settings.worker_id(service_name)
        ours["baton.namespace"] = settings.namespace
    # The environment's attributes win over ours (Resource.create merges the other way).
    resource = Resource.create(ours).merge(OTELResourceDetector().detect())
    if span_exporters:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        from baton.observability.roots import dropped_root, id_generator

        # sampler: OTEL_TRACES_SAMPLER
        tracer_provider = TracerProvider(resource=resource, id_generator=id_generator(),
                                         shutdown_on_exit=False)  # ours, bounded: below
        for exporter, simple in span_exporters:
            processor = SimpleSpanProcessor(exporter) if simple else BatchSpanProcessor(exporter)
            tracer_provider.add_span_processor(processor)
        state.own_tracer_provider = tracer_provider
        state.own_roots = functools.partial(dropped_root, tracer_provider)
        otel_trace.set_tracer_provider(tracer_provider)
        state._shutdown.append(tracer_provider.shutdown)
    if metric_exporters:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        readers = [PeriodicExportingMetricReader(_with_kept_histograms(e, resource))
                   for e in metric_exporters]
        meter_provider = MeterProvider(resource=resource, metric_readers=readers,
                                       shutdown_on_exit=False)
        otel_metrics.set_meter_provider(meter_provider)
        state.own_meter_provider = meter_provider
        state._shutdown.append(meter_provider.shutdown)
    # The SDK's own exit hooks would wait out an unreachable collector without bound.
    atexit.register(shutdown)
    state.installed = True
    return True


def shutdown(timeout_s: float | None = None) -> bool:
    """Flush and stop what :func:`setup` installed (batched spans go out now), waiting at
    most ``timeout_s`` (``Settings.telemetry_flush_timeout_s``, 3 s by default); True when
    all went out in time. Idempotent.

    The SDK's shutdowns wait out each exporter's retries against a collector that does not
    answer (10 s per exporter by default), and a service's exit would wait with them, past
    its stop grace period. They run on a daemon thread instead: what has not gone out by the
    deadline is dropped with the process, and the exit says so on stderr."""
    calls, state._shutdown = state._shutdown, []
    if not calls:
        return True
    timeout_s = state.flush_timeout_s if timeout_s is None else timeout_s

    def flush() -> None:
        for call in calls:
            try:
                call()
            except Exception as exc:  # an unreachable collector must not fail the exit
                print(f"telemetry shutdown: {exc!r}", file=sys.stderr)

    flushing = threading.Thread(target=flush, name="baton-telemetry-flush", daemon=True)
    flushing.start()
    flushing.join(timeout_s)
    if flushing.is_alive():
        print(f"telemetry: spans and metrics not flushed within {timeout_s:g} s (is the "
              "collector reachable?); exiting without them "
              "(BATON_TELEMETRY_FLUSH_TIMEOUT_S)", file=sys.stderr)
        return False
    return True


def _with_kept_histograms(exporter: Any, resource: Any) -> Any:
    """``exporter``, adding the :class:`Histogram` points of ``state.kept`` to each export."""
    return kept_histograms_exporter(exporter, resource, lambda: state.kept, SCOPE, _version())


# ---------------------------------------------------------------------------- propagation


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
