"""Baton's own histograms (kept in-process under its MeterProvider) export what the SDK's
histograms would: names, units, buckets, attributes and temporality."""

from __future__ import annotations

from typing import Any

import pytest

from baton.observability import telemetry
from baton.observability.otel_state import state
from tests.otel_host import host_telemetry, metric_points


class _Received:
    """A metric exporter that keeps what it is given (the SDK's MetricExporter interface)."""

    def __init__(self, temporality: Any = None) -> None:
        from opentelemetry.sdk.metrics import Histogram as SdkHistogram
        from opentelemetry.sdk.metrics.export import AggregationTemporality

        self._preferred_temporality = {
            SdkHistogram: temporality or AggregationTemporality.CUMULATIVE}
        self._preferred_aggregation: dict[type, Any] = {}
        self.exports: list[Any] = []

    def export(self, data: Any, timeout_millis: float = 10_000, **kw: Any) -> Any:
        self.exports.append(data)
        return None


def _points(data: Any, name: str) -> list[Any]:
    return [p for rm in data.resource_metrics for sm in rm.scope_metrics
            if sm.scope.name == telemetry.SCOPE for m in sm.metrics if m.name == name
            for p in m.data.data_points]


def test_a_kept_histogram_exports_what_the_sdk_histogram_would(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.resources import Resource

    values = [0.0, 0.004, 0.005, 0.0051, 0.3, 0.3, 75.0, 2.5]
    attrs = [{"baton.hop": "dispatch"}, {"baton.hop": "wake"}]
    kept: list[telemetry.Histogram] = []
    monkeypatch.setattr(state, "kept", kept)
    with host_telemetry() as host:
        meter = otel_metrics_meter()
        sdk = telemetry.Instruments.create(meter)
        ours = telemetry.Instruments.create(meter, kept)
        assert [h.name for h in kept] == [
            "baton.handoff.duration", "messaging.process.duration",
            "gen_ai.client.operation.duration", "gen_ai.client.token.usage"]
        for i, value in enumerate(values):
            sdk.handoff.record(value, attrs[i % 2])
            ours.handoff.record(value, attrs[i % 2])
        expected = {tuple(p.attributes.items()): p
                    for p in metric_points(host.metrics)["baton.handoff.duration"]}
    inner = _Received()
    exporter = telemetry._with_kept_histograms(inner, Resource.create({}))
    exporter.export(None)
    [data] = inner.exports
    got = _points(data, "baton.handoff.duration")
    assert len(got) == 2 == len(expected)
    for point in got:
        want = expected[tuple(point.attributes.items())]
        assert (point.count, point.sum, point.min, point.max) == (
            want.count, want.sum, want.min, want.max)
        assert list(point.bucket_counts) == list(want.bucket_counts)
        assert list(point.explicit_bounds) == list(want.explicit_bounds)
    [metric] = [m for rm in data.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics if m.name == "baton.handoff.duration"]
    assert metric.unit == "s" and "hands work over" in (metric.description or "")
    assert _points(data, "messaging.process.duration") == []  # nothing recorded: no point


def otel_metrics_meter() -> Any:
    from opentelemetry import metrics

    return metrics.get_meter_provider().get_meter(telemetry.SCOPE)


def test_kept_histograms_join_the_sdk_points_and_follow_a_delta_exporter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Metric,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    histogram = telemetry.Histogram("messaging.process.duration", "s", "d", (0.01, 0.1))
    monkeypatch.setattr(state, "kept", [histogram])
    resource = Resource.create({"service.name": "baton-hands"})
    commits = Metric(name="baton.commits", description="", unit="{commit}", data=Sum(
        data_points=[NumberDataPoint(attributes={}, start_time_unix_nano=1, time_unix_nano=2,
                                     value=3)],
        aggregation_temporality=AggregationTemporality.CUMULATIVE, is_monotonic=True))
    sdk_data = MetricsData(resource_metrics=[ResourceMetrics(
        resource=resource, schema_url="", scope_metrics=[ScopeMetrics(
            scope=InstrumentationScope(telemetry.SCOPE), metrics=[commits], schema_url="")])])
    inner = _Received(AggregationTemporality.DELTA)
    exporter = telemetry._with_kept_histograms(inner, resource)
    histogram.record(0.05, {"baton.role": "hands"})
    exporter.export(sdk_data)
    histogram.record(0.5, {"baton.role": "hands"})
    histogram.record(0.005, {"baton.role": "hands"})
    exporter.export(sdk_data)
    exporter.export(sdk_data)  # nothing new: no point
    first, second, third = inner.exports
    [scope] = first.resource_metrics[0].scope_metrics
    assert [m.name for m in scope.metrics] == ["baton.commits", "messaging.process.duration"]
    [p1] = _points(first, "messaging.process.duration")
    [p2] = _points(second, "messaging.process.duration")
    assert (p1.count, list(p1.bucket_counts)) == (1, [0, 1, 0])
    assert (p2.count, list(p2.bucket_counts), p2.sum) == (2, [1, 0, 1], 0.505)
    assert p2.start_time_unix_nano >= p1.time_unix_nano
    assert _points(third, "messaging.process.duration") == []


def test_an_exporter_without_a_temporality_preference_gets_cumulative_points(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``OTEL_METRICS_EXPORTER=console``: the SDK's console exporter states no preferred
    temporality (None), and the wrapper exports the kept points to it as cumulative."""
    import io
    import json

    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
    from opentelemetry.sdk.resources import Resource

    histogram = telemetry.Histogram("baton.handoff.duration", "s", "d", (0.01, 0.1))
    monkeypatch.setattr(state, "kept", [histogram])
    out = io.StringIO()
    inner = ConsoleMetricExporter(out=out)
    assert inner._preferred_temporality is None
    exporter = telemetry._with_kept_histograms(inner, Resource.create({}))
    histogram.record(0.05, {"baton.hop": "wake"})
    exporter.export(None)
    histogram.record(0.5, {"baton.hop": "wake"})
    exporter.export(None)
    text, exports = out.getvalue(), []
    decoder, at = json.JSONDecoder(), 0
    while text[at:].strip():  # one indented JSON document per export
        at += len(text[at:]) - len(text[at:].lstrip())
        found, at = decoder.raw_decode(text, at)
        exports.append(found)
    _first, second = exports
    [metric] = second["resource_metrics"][0]["scope_metrics"][0]["metrics"]
    [point] = metric["data"]["data_points"]
    assert metric["name"] == "baton.handoff.duration" and point["count"] == 2
    assert point["bucket_counts"] == [0, 1, 1]


def test_measurements_from_several_threads_while_exporting_are_all_counted_once() -> None:
    """Records append to a queue folded in batches by the recording thread or at a
    snapshot (the exporter's thread): none lost, none twice, each point consistent."""
    import threading

    histogram = telemetry.Histogram("baton.handoff.duration", "s", "d", (0.01, 0.1))
    per_thread, attrs = 20_000, {"baton.hop": "wake"}
    go = threading.Barrier(3)

    def record(amount: float) -> None:
        go.wait()
        for _ in range(per_thread):
            histogram.record(amount, attrs)

    def export(until: threading.Thread) -> None:
        go.wait()
        while until.is_alive():
            for _attrs, n, _total, _low, _high, counts in histogram.snapshot():
                assert sum(counts) == n

    writers = [threading.Thread(target=record, args=(a,)) for a in (0.005, 0.05)]
    reader = threading.Thread(target=export, args=(writers[0],))
    for t in (*writers, reader):
        t.start()
    for t in (*writers, reader):
        t.join()
    [(got, n, total, low, high, counts)] = histogram.snapshot()
    assert got == attrs and n == 2 * per_thread and counts == [per_thread, per_thread, 0]
    assert (low, high) == (0.005, 0.05) and abs(total - per_thread * 0.055) < 1e-6
