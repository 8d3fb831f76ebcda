"""Telemetry: nothing without a configured provider (the wrappers call straight through),
and with a host's global providers the spans, context propagation and metrics of the
middleware (in-memory exporter and reader); Baton's own setup() only from its entry points."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from opentelemetry import trace as otel_trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from baton.brain.scheduler import advance
from baton.errors import StaleFenceError
from baton.models import OutboxRow
from baton.observability import exporters, propagation, telemetry, tracing
from baton.observability.log import add_trace_id
from baton.observability.otel_state import state
from baton.observability.span_file import JsonLinesSpanExporter
from baton.store.writes import Writes
from tests.otel_host import host_telemetry, metric_points
from tests.unit.telemetry_fakes import PARENT, FakeMsg, FakeStore, Item, intent

# ---------------------------------------------------------------------------- off


def test_no_otel_environment_installs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "role", "")
    env = {"BATON_NAMESPACE": "x", "PATH": "/usr/bin"}
    assert telemetry.setup("brain", env=env) is False
    assert telemetry.tracer() is None and telemetry.instruments() is None
    # The process-wide providers are still the API's proxies: no SDK was installed.
    assert type(otel_trace.get_tracer_provider()).__name__ == "ProxyTracerProvider"
    assert telemetry.setup("brain", env={"OTEL_SDK_DISABLED": "true",
                                         "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}) is False


async def test_wrappers_call_straight_through_when_off(monkeypatch: pytest.MonkeyPatch) -> None:
    class Explodes:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"tracer used while telemetry is off: {name}")

    # No provider configured: the API's proxy would hand out a tracer, Baton must not ask.
    monkeypatch.setattr(otel_trace.ProxyTracerProvider, "get_tracer",
                        lambda *a, **k: Explodes())
    assert telemetry.tracer() is None
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
    class Model:
        async def generate(self, request: Any) -> str:
            return "answer"

    # Wrapped once, checked at each call: a provider configured later still sees the calls.
    model = tracing.traced_model("scripted", Model())
    assert await model.generate(object()) == "answer"

    class Worker:
        @tracing.consumer("hands")
        async def handle(self, msg: Any) -> str | None:
            return propagation.current_trace_id()

    # Not tracing here, a log line still names the trace of the message being handled.
    assert await Worker().handle(FakeMsg({"traceparent": PARENT})) == PARENT[3:35]


def test_exporters_follow_the_standard_variables(tmp_path: Path) -> None:
    assert exporters.span_exporters({}) == []
    assert exporters.metric_exporters({}) == []
    [(otlp, batched_later)] = exporters.span_exporters(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert isinstance(otlp, OTLPSpanExporter) and batched_later is False
    [(otlp, _)] = exporters.span_exporters(
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert isinstance(otlp, OTLPSpanExporter)
    assert exporters.metric_exporters(
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}) == []
    [metric] = exporters.metric_exporters({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert isinstance(metric, OTLPMetricExporter)
    [(console, _)] = exporters.span_exporters({"OTEL_TRACES_EXPORTER": "console"})
    assert type(console).__name__ == "ConsoleSpanExporter"
    # One JSON line per span, like the log lines of the same stream (the SDK indents).
    provider = TracerProvider()
    finished = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(finished))
    provider.get_tracer("t").start_span("one", attributes={"a": 1}).end()
    [span] = finished.get_finished_spans()
    line = console.formatter(span)
    assert line.count("\n") == 1 and json.loads(line)["name"] == "one"
    [metrics] = exporters.metric_exporters({"OTEL_METRICS_EXPORTER": "console"})
    assert metrics.formatter is exporters.one_line
    assert exporters.span_exporters({"OTEL_TRACES_EXPORTER": "none",
                                     "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == []
    [(jsonl, at_once)] = exporters.span_exporters({exporters.FILE_ENV: str(tmp_path / "s")})
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
    assert first.attributes["messaging.operation.type"] == "send"
    assert first.attributes["messaging.operation.name"] == "publish"
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


UNSAMPLED = PARENT[:-2] + "00"


class CompletingStore:
    @tracing.traced_complete
    async def complete(self, session_id: str, intent: Any, attempt: int, result: Any,
                       worker: Any, headers: dict[str, str] | None = None) -> bool:
        self.headers = headers
        return True


async def test_work_under_an_unsampled_parent_makes_no_span_and_hands_the_trace_on(
        otel: Any) -> None:
    spans, reader = otel
    rows = [Item("t.tool.send_email", b"{}", "s-1/4/0", {"traceparent": UNSAMPLED})]
    with tracing.publish_spans(rows) as items:
        assert items[0] is rows[0]  # sent as it is: no span, no header copy
    with tracing.publish_span("t.wake.a.1", "s-1/5/0", rows[0].headers) as sent:
        assert sent is rows[0].headers
    store, completing = FakeStore(), CompletingStore()

    class Result:
        outcome, recovery = "ok", "none"

    class Worker:
        @tracing.consumer("brain")
        async def handle(self, msg: Any) -> dict[str, Any]:
            writes = Writes(kind="tools", runs=[intent()],
                            outbox=[OutboxRow(subject="t.tool.send_email", data="{}")])
            await store.commit("s-1", 4, writes, None)
            await completing.complete("s-1", intent(), 1, Result(), None)
            await advance(_Handler(), _Task(), _Ctx())
            assert writes.runs[0].trace == {"traceparent": UNSAMPLED}
            assert writes.outbox[0].headers == {"traceparent": UNSAMPLED}
            return add_trace_id(None, "info", {"event": "x"})

    line = await Worker().handle(FakeMsg({"traceparent": UNSAMPLED, "Nats-Msg-Id": "s-1/4/0"}))
    assert spans.get_finished_spans() == ()
    # The same trace and sampled flag go on, so the next process decides the same way.
    assert completing.headers == {"traceparent": UNSAMPLED}
    assert line["trace_id"] == PARENT[3:35]
    assert otel_trace.get_current_span().get_span_context().is_valid is False  # detached
    points = metric_points(reader)  # metrics are kept for every message
    assert sum(p.value for p in points["baton.commits"]) == 2
    assert len(points["messaging.process.duration"]) == 1


class _Task:
    id, kind = "gen-1", "generate"

    class checkpoint:
        phase = "call"

    class state:
        name = "running"


class _Ctx:
    session_id, fence = "s-1", 4


class _Handler:
    async def advance(self, task: Any, ctx: Any) -> str:
        return "advanced"


async def test_a_sampler_that_ignores_parents_still_gets_every_span() -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    with host_telemetry() as host:
        host.tracer_provider.sampler = ALWAYS_ON  # no parent-based decision to rely on
        rows = [Item("t.tool.send_email", b"{}", "s-1/4/0", {"traceparent": UNSAMPLED})]
        with tracing.publish_spans(rows) as items:
            assert items[0].headers is not None and items[0].headers["traceparent"] != UNSAMPLED
        [span] = host.spans.get_finished_spans()
        assert f"{span.context.trace_id:032x}" == PARENT[3:35]


def test_an_unsampled_traceparent_is_read_from_the_header(otel: Any) -> None:
    assert telemetry.tracer() is not None and state.follows_parent and state.attribute_free
    assert propagation.unsampled_header({"traceparent": UNSAMPLED})
    assert not propagation.unsampled_header({"traceparent": PARENT})
    assert not propagation.unsampled_header({"traceparent": "00-" + "0" * 32 + PARENT[35:-2]
                                           + "00"})
    assert not propagation.unsampled_header({"traceparent": "garbage"})
    assert not propagation.unsampled_header(None)


async def test_the_model_call_is_a_client_span_keeping_the_signature(otel: Any) -> None:
    import inspect

    spans, reader = otel

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

    class Failing:
        async def generate(self, request: Any) -> Response:
            raise TimeoutError

    with pytest.raises(TimeoutError):
        await tracing.traced_model("openai:m", Failing()).generate(Request())
    # The metrics: a duration per call (the failed one with its error type), the tokens by type.
    points = metric_points(reader)
    durations = {p.attributes.get("error.type"): dict(p.attributes)
                 for p in points["gen_ai.client.operation.duration"]}
    assert durations[None] == {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "m",
                               "gen_ai.system": "m", "gen_ai.request.model": "m"}
    assert durations["TimeoutError"]["gen_ai.provider.name"] == "openai"
    tokens = {p.attributes["gen_ai.token.type"]: p.sum for p in points["gen_ai.client.token.usage"]}
    assert tokens == {"input": 3, "output": 5}


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


# ---------------------------------------------------------------------------- handing on


async def test_an_unsampled_message_hands_its_own_headers_on_and_keeps_its_context(
        otel: Any) -> None:
    spans, _ = otel
    incoming = {"traceparent": UNSAMPLED, "tracestate": "vendor=x", "baggage": "tenant=t1",
                "Nats-Msg-Id": "s-1/4/0"}
    store = FakeStore()

    class Worker:
        @tracing.consumer("hands")
        async def handle(self, msg: Any) -> dict[str, str]:
            assert propagation.unsampled()
            # Instrumented code under the message (a tool's HTTP client) is not sampled.
            with otel_trace.get_tracer("tool").start_as_current_span("http") as span:
                assert not span.is_recording()
                # A span of the host's own that records is the parent of what it submits.
                root = otel_trace.get_tracer("tool").start_span(
                    "own", context=otel_trace.set_span_in_context(otel_trace.INVALID_SPAN))
                with otel_trace.use_span(root, end_on_exit=True):
                    await store.submit("s-2", request_id="q", wake_subject="t.wake.a.1")
            return propagation.inject()

    sent = await Worker().handle(FakeMsg(incoming))
    assert sent == {k: incoming[k] for k in ("traceparent", "tracestate", "baggage")}
    assert propagation.carried() is None and not propagation.unsampled()
    submitted = store.seen[-1]
    assert submitted["traceparent"][3:35] != UNSAMPLED[3:35]  # the host's own new trace
    assert {s.name for s in spans.get_finished_spans()} >= {"own", "submit"}


def test_a_lone_traceparent_gives_the_context_the_propagators_would() -> None:
    from opentelemetry import propagate

    for value in (UNSAMPLED, PARENT):
        found = propagation._plain_carried(value)
        assert found is not None and found[1] == {"traceparent": value}
        mine = otel_trace.get_current_span(found[0])
        theirs = otel_trace.get_current_span(propagate.extract({"traceparent": value}))
        assert mine.get_span_context() == theirs.get_span_context()
        assert mine.get_span_context().is_remote
    for value in ("01" + UNSAMPLED[2:], UNSAMPLED.upper(),
                  UNSAMPLED[:36] + "0" * 16 + UNSAMPLED[52:]):
        assert propagation._plain_carried(value) is None  # left to the propagators


async def test_a_phase_binds_its_task_and_phase_for_log_lines_and_restores_what_was_bound(
) -> None:
    import structlog

    seen: list[dict[str, Any]] = []

    class Handler:
        async def advance(self, task: Any, ctx: Any) -> str:
            seen.append(structlog.contextvars.get_contextvars())
            return "advanced"

    class Failing:
        async def advance(self, task: Any, ctx: Any) -> str:
            raise RuntimeError("phase failed")

    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(task_id="outer", worker="brain-1")
    try:
        assert await advance(Handler(), _Task(), _Ctx()) == "advanced"
        assert seen == [{"task_id": "gen-1", "phase": "call", "worker": "brain-1"}]
        assert structlog.contextvars.get_contextvars() == {"task_id": "outer",
                                                             "worker": "brain-1"}
        with pytest.raises(RuntimeError):
            await advance(Failing(), _Task(), _Ctx())
        assert structlog.contextvars.get_contextvars() == {"task_id": "outer",
                                                             "worker": "brain-1"}
    finally:
        structlog.contextvars.clear_contextvars()
