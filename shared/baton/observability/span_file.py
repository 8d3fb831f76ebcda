"""A span exporter that appends each finished span to a file as one JSON line.

For tests and debugging (``BATON_OTEL_FILE``, :func:`~baton.observability.telemetry.setup`):
the spans of several processes, even one SIGKILLed, can be merged from their files.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["JsonLinesSpanExporter"]


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
