"""Telemetry with Baton used as a library: a host's span is the parent of what Baton does
for it, and Baton installs no provider, SDK or log handler of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from opentelemetry import trace as otel_trace

from baton.observability import telemetry, tracing
from tests.otel_host import metric_points
from tests.unit.telemetry_fakes import PARENT, FakeMsg, FakeStore


async def test_the_host_span_is_the_parent_of_a_submit_and_its_trace_goes_on(otel: Any) -> None:
    spans, _ = otel
    store = FakeStore()
    host = otel_trace.get_tracer("host-app")
    with host.start_as_current_span("POST /notices") as request:
        await store.submit("s-1", request_id="q", wake_subject="t.wake.a.1")
    submit, root = spans.get_finished_spans()
    assert root.name == "POST /notices" and root.parent is None
    assert submit.parent is not None and submit.parent.span_id == request.get_span_context().span_id
    assert submit.instrumentation_scope.name == "baton"
    assert submit.attributes["messaging.operation.type"] == "create"
    assert submit.attributes["db.system.name"] == "redis"
    assert submit.attributes["db.stored_procedure.name"] == "submit"
    # The headers saved with the wake row carry the host's trace, with the submit as parent.
    saved = store.seen[-1]["traceparent"]
    assert saved.startswith(f"00-{root.context.trace_id:032x}-{submit.context.span_id:016x}-")


async def test_a_propagated_context_flows_into_a_submit_without_any_provider() -> None:
    # A host that only propagates (no SDK): no span is made, the trace id still goes on.
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    assert telemetry.tracer() is None
    incoming = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331,
                           is_remote=True, trace_flags=TraceFlags(1))
    store = FakeStore()
    with otel_trace.use_span(NonRecordingSpan(incoming)):
        await store.submit("s-1", request_id="q", wake_subject="t.wake.a.1")
    assert store.seen[-1] == {"traceparent": PARENT}


async def test_durations_are_seconds_and_names_follow_the_conventions(otel: Any) -> None:
    spans, reader = otel

    class Worker:
        @tracing.consumer("brain")
        async def handle(self, msg: Any) -> None:
            return None

    msg = FakeMsg({"traceparent": PARENT, "Nats-Msg-Id": "s-1/4/0"})
    msg.metadata.consumer = "wake-notices-1"  # type: ignore[attr-defined]
    msg.data = b"{}"  # type: ignore[attr-defined]
    await Worker().handle(msg)
    [span] = spans.get_finished_spans()
    assert span.attributes["messaging.consumer.group.name"] == "wake-notices-1"
    assert span.attributes["messaging.message.body.size"] == 2
    assert span.attributes["baton.session_id"] == "s-1"
    data = reader.get_metrics_data()
    units = {m.name: m.unit for rm in data.resource_metrics for sm in rm.scope_metrics
             for m in sm.metrics}
    assert units["messaging.process.duration"] == "s"
    [point] = metric_points(reader)["messaging.process.duration"]
    assert point.attributes["messaging.system"] == "nats" and 0 <= point.sum < 60


def _run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)


def test_using_baton_as_a_library_installs_no_provider_no_sdk_and_no_log_handler() -> None:
    code = """
import logging, sys
from opentelemetry import metrics, trace
import baton.brain.worker, baton.hands.worker, baton.relay.worker, baton.client
from baton.observability import tracing
from baton.observability.telemetry import tracer, instruments
assert tracer() is None and instruments() is None
assert type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider"
assert type(metrics.get_meter_provider()).__name__ == "_ProxyMeterProvider"
# (redis-py imports the metrics SDK for its own instruments; the tracing SDK stays out.)
assert "opentelemetry.sdk.trace" not in sys.modules, "the SDK is imported on a library path"
assert logging.getLogger().handlers == [], logging.getLogger().handlers
print("ok")
"""
    assert _run_python(code).stdout.strip() == "ok"


def test_an_entry_points_configure_renders_library_records_as_json_lines() -> None:
    code = """
import logging, warnings
from baton.observability import log
log.configure("info", "json")
logging.getLogger("nats.aio.client").warning("reconnecting to %s", "n1")
logging.getLogger("aiohttp.access").info("GET /healthz 200")  # below the library level
warnings.warn("an old argument", DeprecationWarning)
import structlog
structlog.get_logger("baton").info("worker_started", worker="brain-1")
log.configure("info", "json")  # a second call replaces its handler, never adds one
assert len(logging.getLogger().handlers) == 1
"""
    lines = [json.loads(line) for line in
             _run_python(code).stderr.splitlines() if line.strip()]
    assert [(ln.get("logger"), ln["level"]) for ln in lines] == [
        ("nats.aio.client", "warning"), ("py.warnings", "warning"), (None, "info")]
    assert lines[0]["event"] == "reconnecting to n1" and "timestamp" in lines[0]
    assert lines[2]["event"] == "worker_started" and lines[2]["worker"] == "brain-1"


def test_the_sdk_is_imported_only_inside_setup() -> None:
    import ast
    import importlib

    found = []
    roots = [Path(d) for name in ("baton", "baton.brain", "baton.hands", "baton.relay")
             for d in importlib.import_module(name).__path__]
    files = {f for root in roots for f in root.rglob("*.py")}
    assert len(files) > 50
    for path in files:
        tree = ast.parse(path.read_text())
        nested = {id(n) for f in ast.walk(tree)
                  if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                  for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [
                    a.name for a in node.names]
                if any(n.startswith("opentelemetry.sdk") for n in names):
                    found.append((path.name, id(node) in nested))
    assert found and all(inside for _, inside in found), found
    # setup's own module and what it installs: the exporters the environment names, the
    # kept-histogram and file exporters, the id generator
    assert {name for name, _ in found} == {"telemetry.py", "exporters.py", "metrics.py",
                                           "span_file.py", "roots.py"}, found
