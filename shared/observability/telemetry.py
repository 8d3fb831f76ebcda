"""OpenTelemetry for one process: set up from the standard ``OTEL_*`` variables, or nothing.

:func:`setup` is called once by each entry point (``baton brain|hands|relay|submit|start``)
and :func:`shutdown` flushes at exit. What it reads:

* traces: an OTLP (http/protobuf) exporter when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set; ``OTEL_TRACES_EXPORTER`` may name
  ``otlp``, ``console`` (to stderr) or ``none`` explicitly. ``OTEL_SERVICE_NAME``,
  ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*`` and the exporter's
  own variables (headers, timeout, ...) are honoured by the SDK; ``OTEL_SDK_DISABLED=true``
  turns everything off.
* metrics: the same, with ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` / ``OTEL_METRICS_EXPORTER``.
* ``BATON_OTEL_FILE=PATH`` (ours, for tests): every finished span as one JSON line appended
  to PATH as it ends, so the spans of several processes (even one SIGKILLed) can be merged.

With none of these set nothing is installed: :data:`state` stays inactive, and every wrapper
in :mod:`baton.observability.tracing` returns after one attribute check, creating no span, context or
header. The spans and instruments themselves are made only by :mod:`baton.observability.tracing`.
"""

from __future__ import annotations

import contextvars
import json
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import propagate
from opentelemetry import trace as otel_trace
from opentelemetry.context import Context

__all__ = [
    "FILE_ENV", "Instruments", "JsonLinesSpanExporter", "current_trace_id", "extract", "inject",
    "install", "reset", "setup", "shutdown", "state", "trace_id_of",
]

FILE_ENV = "BATON_OTEL_FILE"
TRACER_NAME = "baton"


@dataclass
class Instruments:
    """The metric instruments Baton records (see :mod:`baton.observability.tracing` for where)."""

    commits: Any
    refused: Any
    handoff: Any
    redeliveries: Any
    takeovers: Any
    backlog: dict[str, tuple[int, int]] = field(default_factory=dict)  # shard -> (rows, age)

    @classmethod
    def create(cls, meter: Any) -> Instruments:
        from opentelemetry.metrics import CallbackOptions, Observation

        inst = cls(
            commits=meter.create_counter(
                "baton.commits", unit="{commit}",
                description="State transitions committed (submit, commit, complete)"),
            refused=meter.create_counter(
                "baton.commits.refused", unit="{write}",
                description="Writes refused by a fence: a stale lease or a stale attempt"),
            handoff=meter.create_histogram(
                "baton.handoff.duration", unit="ms",
                description="Time from the commit that hands work over to the process that "
                            "takes it (hop: submit, dispatch, wake)"),
            redeliveries=meter.create_counter(
                "baton.redeliveries", unit="{message}",
                description="Messages JetStream delivered more than once"),
            takeovers=meter.create_counter(
                "baton.takeovers", unit="{takeover}",
                description="Leases (brain) and tool attempts (hands) taken from another "
                            "worker"),
        )

        def rows(_: CallbackOptions) -> Iterable[Observation]:
            for shard, (n, _age) in list(inst.backlog.items()):
                yield Observation(n, {"baton.shard": shard})

        def age(_: CallbackOptions) -> Iterable[Observation]:
            for shard, (_n, ms) in list(inst.backlog.items()):
                yield Observation(ms, {"baton.shard": shard})

        meter.create_observable_gauge(
            "baton.outbox.backlog", callbacks=[rows], unit="{row}",
            description="Outbox rows not yet published, per shard (sampled by the relay)")
        meter.create_observable_gauge(
            "baton.outbox.oldest_age", callbacks=[age], unit="ms",
            description="Age of the oldest unpublished outbox row, per shard")
        return inst


class _State:
    """What this process has installed. ``tracing`` / ``metrics`` are the fast-path flags."""

    def __init__(self) -> None:
        self.tracing = False
        self.tracer: Any = otel_trace.NoOpTracer()
        self.metrics: Instruments | None = None
        self.active = False  # tracing or metrics: whether the wrappers do anything
        self.role = ""
        self._shutdown: list[Callable[[], Any]] = []


state = _State()

# The trace id of the message being handled when this process does not trace itself (taken
# from its traceparent header), so log lines still name the trace they belong to.
_incoming_trace: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "baton_incoming_trace", default=None)


# ---------------------------------------------------------------------------- set up


def setup(service_name: str, settings: Any = None,
          env: Mapping[str, str] | None = None) -> bool:
    """Install exporters from the environment; True when anything was installed.

    ``service_name`` is the role (``brain``, ``hands``, ``relay``, ``client``): the service
    is ``baton-<role>`` unless ``OTEL_SERVICE_NAME`` (or ``service.name`` in
    ``OTEL_RESOURCE_ATTRIBUTES``) says otherwise. Idempotent: a second call does nothing.
    """
    env = os.environ if env is None else env
    if state.active or _truthy(env.get("OTEL_SDK_DISABLED")):
        return state.active
    span_exporters = _span_exporters(env)
    metric_exporters = _metric_exporters(env)
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
    tracer_provider = meter_provider = None
    if span_exporters:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        tracer_provider = TracerProvider(resource=resource)  # sampler: OTEL_TRACES_SAMPLER
        for exporter, simple in span_exporters:
            processor = SimpleSpanProcessor(exporter) if simple else BatchSpanProcessor(exporter)
            tracer_provider.add_span_processor(processor)
        otel_trace.set_tracer_provider(tracer_provider)
    if metric_exporters:
        from opentelemetry import metrics as otel_metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        readers = [PeriodicExportingMetricReader(e) for e in metric_exporters]
        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        otel_metrics.set_meter_provider(meter_provider)
    install(tracer_provider, meter_provider, role=service_name)
    return True


def install(tracer_provider: Any = None, meter_provider: Any = None, *, role: str = "") -> None:
    """Use these providers (an SDK TracerProvider / MeterProvider) from now on.

    :func:`setup` calls it; tests call it directly with in-memory exporters and readers,
    without touching the global providers, and undo it with :func:`reset`.
    """
    if tracer_provider is not None:
        state.tracer = tracer_provider.get_tracer(TRACER_NAME)
        state.tracing = True
        state._shutdown.append(tracer_provider.shutdown)
    if meter_provider is not None:
        state.metrics = Instruments.create(meter_provider.get_meter(TRACER_NAME))
        state._shutdown.append(meter_provider.shutdown)
    state.role = role or state.role
    state.active = state.tracing or state.metrics is not None


def shutdown() -> None:
    """Flush and stop the exporters (spans still in a batch are sent now). Idempotent."""
    calls, state._shutdown = state._shutdown, []
    for call in calls:
        try:
            call()
        except Exception as exc:  # an unreachable collector must not fail the exit
            print(f"telemetry shutdown: {exc!r}", file=sys.stderr)


def reset() -> None:
    """Back to nothing installed (tests); flushes what was."""
    shutdown()
    state.__init__()  # type: ignore[misc]


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _names(env: Mapping[str, str], kind: str) -> list[str]:
    """The exporters named by OTEL_<KIND>_EXPORTER, else otlp when an endpoint is set."""
    named = env.get(f"OTEL_{kind}_EXPORTER", "").strip()
    if named:
        return [n.strip().lower() for n in named.split(",") if n.strip()]
    endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
        f"OTEL_EXPORTER_OTLP_{kind}_ENDPOINT")
    return ["otlp"] if endpoint else []


def _span_exporters(env: Mapping[str, str]) -> list[tuple[Any, bool]]:
    """(exporter, export each span at once?) pairs."""
    out: list[tuple[Any, bool]] = []
    for name in _names(env, "TRACES"):
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            out.append((OTLPSpanExporter(), False))
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            # stderr: stdout belongs to the commands' own output (submit prints JSON).
            out.append((ConsoleSpanExporter(out=sys.stderr), False))
        elif name != "none":
            print(f"OTEL_TRACES_EXPORTER: unsupported exporter {name!r} ignored "
                  "(use otlp, console or none)", file=sys.stderr)
    path = env.get(FILE_ENV, "")
    if path:
        out.append((JsonLinesSpanExporter(path), True))
    return out


def _metric_exporters(env: Mapping[str, str]) -> list[Any]:
    out: list[Any] = []
    for name in _names(env, "METRICS"):
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )

            out.append(OTLPMetricExporter())
        elif name == "console":
            from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

            out.append(ConsoleMetricExporter(out=sys.stderr))
        elif name != "none":
            print(f"OTEL_METRICS_EXPORTER: unsupported exporter {name!r} ignored "
                  "(use otlp, console or none)", file=sys.stderr)
    return out


# ---------------------------------------------------------------------------- file exporter


class JsonLinesSpanExporter:
    """Appends each finished span to a file as one JSON object per line (tests, debugging).

    Fields: ``trace_id``, ``span_id``, ``parent_span_id`` (hex; None for a root), ``name``,
    ``kind``, ``start_ns``, ``end_ns``, ``status``, ``attributes``, ``links``, ``resource``.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file = open(path, "a", encoding="utf-8")  # closed by shutdown()

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = [json.dumps(_span_record(s), default=str) + "\n" for s in spans]
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.writelines(lines)
            self._file.flush()  # a SIGKILLed process keeps what it exported
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def _span_record(span: Any) -> dict[str, Any]:
    ctx, parent = span.context, span.parent
    return {
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_span_id": f"{parent.span_id:016x}" if parent is not None else None,
        "name": span.name,
        "kind": span.kind.name,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "links": [{"trace_id": f"{ln.context.trace_id:032x}",
                   "span_id": f"{ln.context.span_id:016x}"} for ln in span.links],
        "resource": dict(span.resource.attributes),
    }


# ---------------------------------------------------------------------------- propagation


def inject(carrier: dict[str, str] | None = None, context: Context | None = None
           ) -> dict[str, str]:
    """The W3C trace context (``traceparent``, ``tracestate``) of the current span."""
    carrier = {} if carrier is None else carrier
    propagate.inject(carrier, context=context)
    return carrier


def extract(headers: Mapping[str, str] | None) -> Context | None:
    """The context carried in message headers; None when they carry none."""
    if not headers or "traceparent" not in headers:
        return None
    return propagate.extract(headers)


def trace_id_of(headers: Mapping[str, str] | None) -> str | None:
    """The trace id in a ``traceparent`` header (``00-<trace id>-<span id>-<flags>``)."""
    value = headers.get("traceparent") if headers else None
    if value and len(value) >= 55 and value[2] == "-":
        return value[3:35]
    return None


def set_incoming_trace(trace_id: str | None) -> None:
    """Remember the handled message's trace id for log lines (when not tracing here)."""
    _incoming_trace.set(trace_id)


def current_trace_id() -> str | None:
    """The trace id log lines carry: the current span's, else the handled message's."""
    if state.tracing:
        ctx = otel_trace.get_current_span().get_span_context()
        if ctx.is_valid:
            return f"{ctx.trace_id:032x}"
    return _incoming_trace.get()
