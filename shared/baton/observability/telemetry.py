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
How a trace is handed on from message to message is :mod:`baton.observability.propagation`.

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
import functools
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace
from opentelemetry.metrics import NoOpMeterProvider
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
from baton.observability.otel_state import state
from baton.observability.propagation import no_propagators, propagators_loaded
from baton.observability.span_file import JsonLinesSpanExporter

__all__ = [
    "FILE_ENV", "SCOPE", "Histogram", "Instruments", "JsonLinesSpanExporter", "Tally",
    "instruments", "setup", "shutdown", "state", "tracer",
]

SCOPE = "baton"  # the instrumentation scope of every span and instrument Baton makes

# The global providers that mean "nobody configured telemetry": the API's proxies (before
# any set_*_provider) and the explicit no-ops.
_NO_TRACING = (ProxyTracerProvider, NoOpTracerProvider)


def _no_metrics(provider: Any) -> bool:
    """Whether ``provider`` records nothing: the API's own no-op, or its proxy before any
    provider is set (a class of the API package itself, which implements no provider;
    the proxy's class is not public)."""
    return (isinstance(provider, NoOpMeterProvider)
            or type(provider).__module__.startswith("opentelemetry.metrics"))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("baton")
    except PackageNotFoundError:  # run from a source tree without an install
        return "0"


def tracer() -> Any:
    """Baton's tracer from the global TracerProvider; None when no provider is configured.

    Called by every wrapper at use time: one look at the global provider (the API's
    public call, under a microsecond), and a new tracer only when the provider changed.
    """
    provider: Any = otel_trace.get_tracer_provider()
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


def instruments() -> Instruments | None:
    """Baton's instruments on the global MeterProvider; None when no provider is configured."""
    provider: Any = otel_metrics.get_meter_provider()
    if provider is not state.meter_provider:
        found = None
        if not _no_metrics(provider):
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
    unset_metrics = _no_metrics(otel_metrics.get_meter_provider())
    span_exporters = exporters.span_exporters(env) if unset_traces else []
    if span_exporters and not propagators_loaded():
        raise ConfigError(f"OTEL_PROPAGATORS: {no_propagators()} Install its package, or "
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


