"""Telemetry: nothing without OTEL_* (the wrappers call straight through), and with it the
spans, context propagation and metrics of the middleware (in-memory exporter and reader)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from opentelemetry import trace as otel_trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from baton.errors import StaleFenceError
from baton.models import OutboxRow, ToolIntent
from baton.observability import telemetry, tracing
from baton.observability.log import add_trace_id
from baton.observability.telemetry import JsonLinesSpanExporter, state
from baton.store.writes import Writes

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Item(NamedTuple):
    subject: str
    data: bytes
    msg_id: str
    headers: dict[str, str] | None = None


class FakeMsg:
    def __init__(self, headers: dict[str, str] | None, delivered: int = 1) -> None:
        self.headers = headers
        self.subject = "t.tool.send_email"

        class Meta:
            num_delivered = delivered

        self.metadata = Meta()


class FakeStore:
    """The Store methods' signatures, decorated like the real ones."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    @tracing.traced_commit
    async def commit(self, session_id: str, fence: int, writes: Writes, worker: Any) -> Any:
        if fence < 0:
            raise StaleFenceError(session_id, fence, 7)
        self.seen.append(writes)
        return 3, 1

    @tracing.traced_submit("submit")
    async def submit(self, session_id: str, *, request_id: str, wake_subject: str,
                     headers: dict[str, str] | None = None) -> Any:
        self.seen.append(headers)
        return "sub", True


def intent(run_id: str = "r-1") -> ToolIntent:
    return ToolIntent(run_id=run_id, session_id="s-1", task_id="gen-1", tool="send_email",
                      operation_id=f"s-1:{run_id}", wake_subject="t.wake.a.1")


@pytest.fixture
def otel() -> Iterator[tuple[InMemorySpanExporter, InMemoryMetricReader]]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    telemetry.install(provider, MeterProvider(metric_readers=[reader]), role="brain")
    try:
        yield spans, reader
    finally:
        telemetry.reset()


def metric_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


# ---------------------------------------------------------------------------- off


def test_no_otel_environment_installs_nothing() -> None:
    env = {"BATON_NAMESPACE": "x", "PATH": "/usr/bin"}
    assert telemetry.setup("brain", env=env) is False
    assert not state.active and not state.tracing and state.metrics is None
    # The process-wide providers are still the API's proxies: no SDK was installed.
    assert type(otel_trace.get_tracer_provider()).__name__ == "ProxyTracerProvider"
    assert telemetry.setup("brain", env={"OTEL_SDK_DISABLED": "true",
                                         "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}) is False


async def test_wrappers_call_straight_through_when_off(monkeypatch: pytest.MonkeyPatch) -> None:
    class Explodes:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"tracer used while telemetry is off: {name}")

    monkeypatch.setattr(state, "tracer", Explodes())
    headers = {"Nats-Msg-Id": "s/1/0"}
    with tracing.publish_span("t.wake.a.1", "s/1/0", headers) as sent:
        assert sent is headers  # the very same object: nothing added, nothing copied
    batch = [Item("t.wake.a.1", b"{}", "s/1/0")]
    with tracing.publish_spans(batch) as items:
        assert items is batch
    store = FakeStore()
    writes = Writes(runs=[intent()], outbox=[OutboxRow(subject="t.tool.send_email", data="{}")])
    assert await store.commit("s-1", 1, writes, None) == (3, 1)
    assert writes.trace == {} and writes.runs[0].trace == {} and writes.outbox[0].headers == {}
    assert await store.submit("s-1", request_id="q", wake_subject="t.wake.a.1") == ("sub", True)
    assert store.seen[-1] is None  # no trace headers were made
    client = object()
    assert tracing.traced_model("scripted", client) is client

    class Worker:
        @tracing.consumer("hands")
        async def handle(self, msg: Any) -> str | None:
            return telemetry.current_trace_id()

    # Not tracing here, a log line still names the trace of the message being handled.
    assert await Worker().handle(FakeMsg({"traceparent": PARENT})) == PARENT[3:35]


def test_exporters_follow_the_standard_variables(tmp_path: Path) -> None:
    assert telemetry._span_exporters({}) == []
    assert telemetry._metric_exporters({}) == []
    [(otlp, batched_later)] = telemetry._span_exporters(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert isinstance(otlp, OTLPSpanExporter) and batched_later is False
    [(otlp, _)] = telemetry._span_exporters(
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert isinstance(otlp, OTLPSpanExporter)
    assert telemetry._metric_exporters(
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}) == []
    [metric] = telemetry._metric_exporters({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert isinstance(metric, OTLPMetricExporter)
    [(console, _)] = telemetry._span_exporters({"OTEL_TRACES_EXPORTER": "console"})
    assert type(console).__name__ == "ConsoleSpanExporter"
    assert telemetry._span_exporters({"OTEL_TRACES_EXPORTER": "none",
                                      "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == []
    [(jsonl, at_once)] = telemetry._span_exporters({telemetry.FILE_ENV: str(tmp_path / "s")})
    assert isinstance(jsonl, JsonLinesSpanExporter) and at_once is True
    jsonl.shutdown()


# ---------------------------------------------------------------------------- on


def test_a_relay_publish_is_a_child_of_the_row_and_hands_its_own_context_on(otel: Any) -> None:
    spans, _ = otel
    rows = [Item("t.tool.send_email", b"{}", "s-1/4/0", {"traceparent": PARENT}),
            Item("t.wake.a.1", b"{}", "s-2/9/0", None)]
    with tracing.publish_spans(rows) as items:
        sent = [i.headers for i in items]
    first, second = spans.get_finished_spans()
    assert first.kind is SpanKind.PRODUCER and first.name == "publish t.tool.send_email"
    assert first.parent is not None and f"{first.parent.span_id:016x}" == PARENT[36:52]
    assert f"{first.context.trace_id:032x}" == PARENT[3:35]
    assert sent[0]["traceparent"] == f"00-{PARENT[3:35]}-{first.context.span_id:016x}-01"
    assert first.attributes["messaging.system"] == "nats"
    assert first.attributes["messaging.destination.name"] == "t.tool.send_email"
    assert first.attributes["messaging.message.id"] == "s-1/4/0"
    assert first.attributes["messaging.operation.type"] == "publish"
    assert first.attributes["baton.session_id"] == "s-1"
    assert second.parent is None and second.attributes["baton.session_id"] == "s-2"


async def test_a_commit_saves_its_span_context_with_runs_rows_and_receipt(otel: Any) -> None:
    spans, reader = otel
    store = FakeStore()
    resent = OutboxRow(subject="t.tool.send_email", data="{}", headers={"traceparent": PARENT})
    writes = Writes(kind="tools", runs=[intent()], outbox=[
        OutboxRow(subject="t.tool.send_email", data="{}"), resent])
    await store.commit("s-1", 4, writes, None)
    [span] = spans.get_finished_spans()
    assert span.name == "commit tools" and span.attributes["baton.fence"] == 4
    mine = f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-"
    assert writes.trace["traceparent"].startswith(mine)
    assert writes.runs[0].trace["traceparent"].startswith(mine)
    assert writes.outbox[0].headers["traceparent"].startswith(mine)
    assert writes.outbox[1].headers["traceparent"] == PARENT  # a re-sent run keeps its own
    with pytest.raises(StaleFenceError):
        await store.commit("s-1", -1, Writes(kind="apply"), None)
    points = metric_points(reader)
    assert [p.value for p in points["baton.commits"]] == [1]
    [refused] = points["baton.commits.refused"]
    assert refused.value == 1 and refused.attributes["error.type"] == "stale_fence"


async def test_a_consumer_span_continues_the_message_trace(otel: Any) -> None:
    spans, reader = otel

    class Worker:
        @tracing.consumer("hands")
        async def handle(self, msg: Any) -> dict[str, Any]:
            return add_trace_id(None, "info", {"event": "x"})

    line = await Worker().handle(FakeMsg({"traceparent": PARENT, "Nats-Msg-Id": "s-1/4/0"}, 2))
    [span] = spans.get_finished_spans()
    assert span.kind is SpanKind.CONSUMER and span.name == "process t.tool.send_email"
    assert f"{span.parent.span_id:016x}" == PARENT[36:52]  # type: ignore[union-attr]
    assert span.attributes["messaging.operation.type"] == "process"
    assert span.attributes["baton.delivery"] == 2
    assert line["trace_id"] == PARENT[3:35]
    [redelivered] = metric_points(reader)["baton.redeliveries"]
    assert redelivered.value == 1


async def test_the_model_call_is_a_client_span_keeping_the_signature(otel: Any) -> None:
    import inspect

    spans, _ = otel

    class Usage(NamedTuple):
        input_tokens: int = 3
        output_tokens: int = 5

    class Response(NamedTuple):
        usage: Usage = Usage()
        stop_reason: str = "end_turn"
        tool_calls: tuple[Any, ...] = ()

    class Streaming:
        async def generate(self, request: Any, on_text: Any = None) -> Response:
            return Response()

        async def aclose(self) -> None: ...

    class Request(NamedTuple):
        model: str = "m"
        request_id: str = "gen-1:1:0"
        entries: tuple[Any, ...] = ()

    model = tracing.traced_model("m", Streaming())
    assert "on_text" in inspect.signature(model.generate).parameters
    assert model.aclose is not None  # the client's own attributes pass through
    await model.generate(Request(), on_text=None)
    [span] = spans.get_finished_spans()
    assert span.kind is SpanKind.CLIENT and span.name == "chat m"
    assert span.attributes["gen_ai.usage.output_tokens"] == 5


def test_the_file_exporter_writes_one_json_line_per_span(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    exporter = JsonLinesSpanExporter(str(path))
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("outer"), tracer.start_as_current_span("inner"):
        pass
    provider.shutdown()
    inner, outer = (json.loads(line) for line in path.read_text().splitlines())
    assert inner["parent_span_id"] == outer["span_id"] and outer["parent_span_id"] is None
    assert inner["trace_id"] == outer["trace_id"] and inner["kind"] == "INTERNAL"
