"""The OpenTelemetry adapter's contract: the SDK's exporters keep their preferences where
:mod:`baton.adapters.opentelemetry` reads them."""

from __future__ import annotations

import pytest

from baton.adapters import opentelemetry as adapter


def test_the_sdk_keeps_an_exporters_preferences_where_the_adapter_reads_them() -> None:
    from opentelemetry.sdk.metrics import Histogram
    from opentelemetry.sdk.metrics.export import AggregationTemporality, ConsoleMetricExporter

    found = adapter.sdk_version()
    assert adapter._checked(found), (
        f"opentelemetry-sdk {found} is not among the versions baton.adapters.opentelemetry "
        f"was checked against ({', '.join(adapter.CHECKED)}): check that MetricExporter "
        "still keeps _preferred_temporality and _preferred_aggregation, then add it")
    wanted = {Histogram: AggregationTemporality.DELTA}
    exporter = ConsoleMetricExporter(preferred_temporality=wanted)
    temporality, aggregation = adapter.exporter_preferences(exporter)
    assert temporality is not None and temporality[Histogram] == AggregationTemporality.DELTA, (
        f"opentelemetry-sdk {found}: MetricExporter no longer keeps the preferred "
        "temporality in _preferred_temporality")
    assert aggregation is None and hasattr(exporter, "_preferred_aggregation"), (
        f"opentelemetry-sdk {found}: MetricExporter no longer keeps _preferred_aggregation")


def test_an_sdk_not_checked_gets_no_preference_and_one_warning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapter, "sdk_version", lambda: "9.0.0")
    monkeypatch.setattr(adapter, "_warned", False)

    class Exporter:
        _preferred_temporality = {"x": "delta"}
        _preferred_aggregation = {"x": "y"}

    assert adapter.exporter_preferences(Exporter()) == (None, None)
    assert adapter._warned
