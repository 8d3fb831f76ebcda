"""New traces begun by a relay: a root the sampler drops is only its ``traceparent``; a root
it keeps is the SDK's span, on the trace id the decision was made on; both as the SDK's own
path would make them (baton.observability.roots)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from baton.observability import propagation, roots, telemetry, tracing
from baton.observability.otel_state import state
from tests.otel_host import _reset_globals, host_telemetry
from tests.unit.telemetry_fakes import PARENT, Item

RATE = 0.5
LOW_64 = (1 << 64) - 1


@pytest.fixture
def ours(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Global providers as ``telemetry.setup`` installs them (its id generator and roots),
    with a sampler keeping half the new traces and the spans kept in memory."""
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(RATE)),
                              id_generator=roots.id_generator())
    monkeypatch.setattr(state, "own_tracer_provider", provider)
    monkeypatch.setattr(state, "own_roots", functools.partial(roots.dropped_root, provider))
    with host_telemetry("baton-relay", provider) as host:
        assert telemetry.tracer() is not None and state.roots is not None
        yield host.spans


def test_a_root_is_dropped_or_kept_by_the_sampler_on_the_trace_id_it_carries(ours: Any) -> None:
    rows = [Item("t.wake.a.1", b"{}", f"s-{i}/1/0", {"Nats-Msg-Id": f"s-{i}/1/0"})
            for i in range(200)]
    with tracing.publish_spans(rows) as items:
        sent = [i.headers for i in items]
    spans = {f"{s.context.trace_id:032x}": s for s in ours.get_finished_spans()}
    bound = TraceIdRatioBased(RATE).bound
    kept = 0
    for row, headers in zip(rows, sent, strict=True):
        assert headers is not None and headers["Nats-Msg-Id"] == row.msg_id
        version, trace_id, span_id, flags = headers["traceparent"].split("-")
        assert (version, len(trace_id), len(span_id)) == ("00", 32, 16) and int(span_id, 16)
        sampled = int(trace_id, 16) & LOW_64 < bound  # TraceIdRatioBased's own rule
        if sampled:  # the SDK's span, on the id the decision was made on
            kept += 1
            span = spans.pop(trace_id)
            assert span.parent is None and span.name == "publish t.wake.a.1"
            assert span.attributes["baton.session_id"] == row.msg_id.split("/")[0]
            assert headers["traceparent"] == f"00-{trace_id}-{span.context.span_id:016x}-03"
        else:  # no span: the header the SDK's NonRecordingSpan would have given
            assert flags == "02"
    assert spans == {}  # no span for a dropped root
    assert 0 < kept < len(rows)  # both ways taken (all alike: odds of 2 in 2**200)


def test_a_row_with_a_context_or_a_current_span_begins_no_trace(ours: Any) -> None:
    unsampled = PARENT[:-2] + "00"
    with tracing.publish_spans([Item("t.tool.x", b"{}", "s/1/0", {"traceparent": unsampled})]
                               ) as items:
        assert items[0].headers == {"traceparent": unsampled}
    tracer = otel_trace.get_tracer("host")
    with tracer.start_as_current_span("host request", context=otel_trace.set_span_in_context(
            otel_trace.NonRecordingSpan(otel_trace.SpanContext(
                int(PARENT[3:35], 16), int(PARENT[36:52], 16), is_remote=True,
                trace_flags=otel_trace.TraceFlags(1))))):
        assert propagation.dropped_root("publish x", otel_trace.SpanKind.PRODUCER) is None
        with tracing.publish_spans([Item("t.wake.a.1", b"{}", "s/2/0")]) as items:
            assert items[0].headers["traceparent"].split("-")[1] == PARENT[3:35]


def test_a_host_provider_begins_its_traces_itself(otel: Any) -> None:
    spans, _ = otel
    assert telemetry.tracer() is not None and state.roots is None
    with tracing.publish_spans([Item("t.wake.a.1", b"{}", "s/1/0")]) as items:
        pass
    [span] = spans.get_finished_spans()  # the host's sampler records every root
    assert items[0].headers["traceparent"].split("-")[1] == f"{span.context.trace_id:032x}"


def test_setup_installs_the_id_generator_and_roots(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("installed", False), ("_shutdown", []), ("role", ""),
                        ("own_tracer_provider", None), ("own_roots", None)):
        monkeypatch.setattr(state, name, value)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    try:
        assert telemetry.setup("relay", env={"OTEL_TRACES_EXPORTER": "none",
                                             telemetry.FILE_ENV: "/dev/null"})
        provider: Any = otel_trace.get_tracer_provider()
        assert type(provider.id_generator).__name__ == "RootIds"
        assert telemetry.tracer() is not None and state.roots is state.own_roots
        root = propagation.dropped_root("publish x", otel_trace.SpanKind.PRODUCER)
        assert root is not None and root.endswith("-02")  # rate 0: every root dropped
    finally:
        telemetry.shutdown()
        _reset_globals()
