"""Play the host application: set OpenTelemetry's global providers, as an app embedding Baton
does, and put the process back as it was afterwards.

The API lets a process set its global providers once; a test suite needs each test to start
with none (the "off" tests) or with its own in-memory exporter. So the exit restores the
API's "never set" state the way OpenTelemetry's own test utilities do
(``opentelemetry.test.globals_test.reset_trace_globals`` / ``reset_metrics_globals``).
Inside the block, Baton sees only the public ``set_tracer_provider`` / ``set_meter_provider``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from opentelemetry import trace as trace_api
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.metrics import set_meter_provider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


class Host(NamedTuple):
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    tracer_provider: TracerProvider


def _reset_globals() -> None:
    trace_api._TRACER_PROVIDER_SET_ONCE = Once()
    trace_api._TRACER_PROVIDER = None
    trace_api._PROXY_TRACER_PROVIDER = trace_api.ProxyTracerProvider()
    metrics_internal._METER_PROVIDER_SET_ONCE = Once()
    metrics_internal._METER_PROVIDER = None
    metrics_internal._PROXY_METER_PROVIDER = metrics_internal._ProxyMeterProvider()


@contextmanager
def host_telemetry(service: str = "host-app",
                   tracer_provider: TracerProvider | None = None) -> Iterator[Host]:
    """Global SDK providers with an in-memory span exporter and metric reader (on
    ``tracer_provider`` when given, e.g. one with its own sampler)."""
    resource = Resource.create({"service.name": service})
    spans = InMemorySpanExporter()
    tracer_provider = tracer_provider or TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    trace_api.set_tracer_provider(tracer_provider)
    set_meter_provider(meter_provider)
    try:
        yield Host(spans, reader, tracer_provider)
    finally:
        tracer_provider.shutdown()
        meter_provider.shutdown()
        _reset_globals()


def metric_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    """The data points of each metric ``reader`` collects now, by metric name."""
    out: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out
