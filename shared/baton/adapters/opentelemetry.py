"""The OpenTelemetry SDK below its public API: what a metric exporter prefers.

Baton's histograms are its own aggregates (:mod:`baton.observability.metrics`), added to
each export by a wrapper around the SDK exporter the environment configured
(``KeptHistogramsExporter``). The wrapper must tell the SDK's reader the temporality and
aggregation the wrapped exporter prefers (an OTLP exporter told to send deltas must get
deltas), and the SDK exposes those only as the private attributes its own reader reads
(``MetricExporter._preferred_temporality`` and ``_preferred_aggregation``, set by
``MetricExporter.__init__``). There is no public getter.

This is not a speed-up but the only way to honour the preference, so it stays, under the
rules of :mod:`baton.adapters`: on an SDK version it was not checked against, or when the
attributes are gone, :func:`exporter_preferences` answers "no preference" (the reader's
defaults: cumulative) and logs one warning; ``tests/unit/test_adapters_opentelemetry.py``
fails, naming the SDK and its version, when the attributes change.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = ["CHECKED", "exporter_preferences", "sdk_version"]

#: The opentelemetry-sdk minor versions whose exporters were checked to keep their
#: preferences in these attributes (the contract test checks the installed one).
CHECKED = ("1.45",)

_warned = False


def sdk_version() -> str:
    try:
        return version("opentelemetry-sdk")
    except PackageNotFoundError:  # pragma: no cover - the SDK is a dependency
        return "0"


def _checked(found: str) -> bool:
    return any(found == v or found.startswith(v + ".") for v in CHECKED)


def exporter_preferences(exporter: Any) -> tuple[Any, Any]:
    """(preferred temporality, preferred aggregation) of an SDK metric exporter, each None
    for no preference; (None, None) on an SDK version not checked, or without them."""
    global _warned
    found = sdk_version()
    temporality = getattr(exporter, "_preferred_temporality", None)
    aggregation = getattr(exporter, "_preferred_aggregation", None)
    if _checked(found) and hasattr(exporter, "_preferred_temporality") \
            and hasattr(exporter, "_preferred_aggregation"):
        return temporality, aggregation
    if not _warned:
        _warned = True
        from baton.observability.log import get_logger

        get_logger("baton.telemetry").warning(
            "otel_exporter_preferences_unknown", sdk_version=found, checked=list(CHECKED),
            effect="Baton's histograms are exported cumulative, whatever the exporter "
                   "prefers")
    return None, None
