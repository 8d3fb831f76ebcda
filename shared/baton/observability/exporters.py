"""Which exporters the standard ``OTEL_*`` variables name, built for :func:`telemetry.setup`.

* traces: ``OTEL_TRACES_EXPORTER`` names ``otlp`` (http/protobuf), ``console`` (to stderr,
  one JSON line per span) or ``none``, comma-separated; unset, an OTLP exporter when
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set.
  ``BATON_OTEL_FILE=PATH`` adds :class:`~baton.observability.span_file.JsonLinesSpanExporter`.
* metrics: the same with ``OTEL_METRICS_EXPORTER`` and ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``.

An unknown name is ignored with a line on stderr. The SDK modules are imported only for
the exporters named: a process with none configured never loads them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from baton.observability.span_file import JsonLinesSpanExporter

__all__ = ["FILE_ENV", "metric_exporters", "one_line", "span_exporters", "truthy"]

FILE_ENV = "BATON_OTEL_FILE"


def truthy(value: str | None) -> bool:
    """An ``OTEL_*`` boolean as the SDK reads it (``OTEL_SDK_DISABLED=true``)."""
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _names(env: Mapping[str, str], kind: str) -> list[str]:
    """The exporters named by OTEL_<KIND>_EXPORTER, else otlp when an endpoint is set."""
    named = env.get(f"OTEL_{kind}_EXPORTER", "").strip()
    if named:
        return [n.strip().lower() for n in named.split(",") if n.strip()]
    endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
        f"OTEL_EXPORTER_OTLP_{kind}_ENDPOINT")
    return ["otlp"] if endpoint else []


def span_exporters(env: Mapping[str, str]) -> list[tuple[Any, bool]]:
    """(exporter, export each span at once?) pairs."""
    out: list[tuple[Any, bool]] = []
    for name in _names(env, "TRACES"):
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            out.append((OTLPSpanExporter(), False))
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            # stderr: stdout belongs to the commands' own output (submit prints JSON). One
            # line per span, like the JSON log lines around it (the SDK indents).
            out.append((ConsoleSpanExporter(out=sys.stderr, formatter=one_line), False))
        elif name != "none":
            print(f"OTEL_TRACES_EXPORTER: unsupported exporter {name!r} ignored "
                  "(use otlp, console or none)", file=sys.stderr)
    path = env.get(FILE_ENV, "")
    if path:
        out.append((JsonLinesSpanExporter(path), True))
    return out


def one_line(data: Any) -> str:
    """A span or an export of metrics as one JSON line, for the console exporters."""
    return f"{data.to_json(indent=None)}\n"


def metric_exporters(env: Mapping[str, str]) -> list[Any]:
    """The metric exporters ``env`` names (each read by a periodic reader)."""
    out: list[Any] = []
    for name in _names(env, "METRICS"):
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )

            out.append(OTLPMetricExporter())
        elif name == "console":
            from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

            out.append(ConsoleMetricExporter(out=sys.stderr, formatter=one_line))
        elif name != "none":
            print(f"OTEL_METRICS_EXPORTER: unsupported exporter {name!r} ignored "
                  "(use otlp, console or none)", file=sys.stderr)
    return out
