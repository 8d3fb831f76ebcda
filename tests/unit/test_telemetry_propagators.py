"""Propagators other than the default W3C ones: a trace still runs through the consumer and
the commit under one that writes its own header (as ``b3`` does), and a propagator named by
``OTEL_PROPAGATORS`` that is not installed stops only what would trace, with a clear error."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import propagate
from opentelemetry import trace as otel_trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter, TextMapPropagator

from baton.models import OutboxRow
from baton.observability import tracing
from baton.store.writes import Writes
from tests.unit.telemetry_fakes import FakeMsg, FakeStore, intent

TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


class OneHeader(TextMapPropagator):
    """A propagator of its own header, ``x-trace: <trace id>-<span id>-<sampled>``."""

    def extract(self, carrier: Any, context: Context | None = None,
                getter: Getter[Any] | None = None) -> Context:
        value = carrier.get("x-trace") if carrier else None
        if not value:
            return context or Context()
        trace_id, span_id, sampled = value.split("-")
        return otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(
            otel_trace.SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True,
                                   trace_flags=otel_trace.TraceFlags(int(sampled)))), context)

    def inject(self, carrier: Any, context: Context | None = None,
               setter: Setter[Any] | None = None) -> None:
        ctx = otel_trace.get_current_span(context).get_span_context()
        if ctx.is_valid:
            carrier["x-trace"] = f"{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags)}"

    @property
    def fields(self) -> set[str]:
        return {"x-trace"}


@pytest.fixture
def one_header() -> Iterator[None]:
    before = propagate.get_global_textmap()
    propagate.set_global_textmap(OneHeader())
    try:
        yield
    finally:
        propagate.set_global_textmap(before)


async def test_a_trace_runs_through_a_consumer_and_a_commit_under_another_propagator(
        otel: Any, one_header: None) -> None:
    spans, _ = otel
    store = FakeStore()
    resent = OutboxRow(subject="t.tool.send_email", data="{}",
                       headers={"x-trace": f"{TRACE}-{'1' * 16}-1"})

    class Worker:
        @tracing.consumer("brain")
        async def handle(self, msg: Any) -> Writes:
            writes = Writes(kind="tools", runs=[intent()], outbox=[
                OutboxRow(subject="t.tool.send_email", data="{}"), resent])
            await store.commit("s-1", 4, writes, None)
            return writes

    writes = await Worker().handle(FakeMsg({"x-trace": f"{TRACE}-{SPAN}-1"}))
    by_name = {s.name: s for s in spans.get_finished_spans()}
    consumed, commit = by_name["process t.tool.send_email"], by_name["commit tools"]
    assert f"{consumed.context.trace_id:032x}" == TRACE
    assert consumed.parent is not None and f"{consumed.parent.span_id:016x}" == SPAN
    assert commit.parent is not None and commit.parent.span_id == consumed.context.span_id
    mine = f"{TRACE}-{commit.context.span_id:016x}-1"
    assert writes.outbox[0].headers == {"x-trace": mine}  # the commit's context handed on
    assert writes.runs[0].trace == {"x-trace": mine}
    assert writes.outbox[1].headers == resent.headers  # a re-sent run keeps its own
    assert "traceparent" not in writes.trace


def test_log_lines_name_the_trace_of_another_propagators_headers(one_header: None) -> None:
    from baton.observability import propagation

    assert propagation.trace_id_of({"x-trace": f"{TRACE}-{SPAN}-0"}) == TRACE
    assert propagation.trace_id_of({"Nats-Msg-Id": "s/1/0"}) is None


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run([sys.executable, "-c", code], env=base | env, capture_output=True,
                          text=True, timeout=60, check=False)


def test_a_propagator_not_installed_stops_only_what_would_trace() -> None:
    untraced = _python(
        "from baton.observability import propagation, telemetry\n"
        "print(propagation.inject({}), propagation.extract({'traceparent': '00-" + TRACE + "-"
        + SPAN + "-01'}), telemetry.setup('client', env={}))",
        OTEL_PROPAGATORS="nosuch")
    assert untraced.returncode == 0, untraced.stderr
    assert untraced.stdout.split() == ["{}", "None", "False"]  # nothing to hand on, no error
    traced = _python(
        "from baton.errors import ConfigError\n"
        "from baton.observability import telemetry\n"
        "try:\n"
        "    telemetry.setup('client', env={'OTEL_TRACES_EXPORTER': 'console'})\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n",
        OTEL_PROPAGATORS="tracecontext,nosuch")
    assert traced.returncode == 0, traced.stderr
    assert traced.stdout.startswith("OTEL_PROPAGATORS: ") and "nosuch" in traced.stdout
    assert "leave OTEL_PROPAGATORS unset" in traced.stdout
