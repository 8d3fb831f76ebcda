"""The metrics the services export over OTLP, histograms kept in the process included.

A DevStack (1 brain, 1 hands, 1 relay) configured like the deploy files for metrics (OTLP
http/protobuf, no traces), exporting every 200 ms to an OTLP endpoint in this process;
after one five-notice session the exports must hold the histograms with the SDK's shape
(explicit buckets, counts that add up) from the processes that record them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from baton.bench.obs_bench import otlp_sink
from baton.bench.sessions import FIVE, bench_client, session_call
from baton.devkit.devstack import DevStack
from tests.helpers import eventually

pytestmark = pytest.mark.slow

Point = tuple[str, str, dict[str, str], Any]  # service, metric, attributes, point


@asynccontextmanager
async def otlp_metrics() -> AsyncIterator[tuple[str, list[Point]]]:
    """An OTLP/HTTP endpoint keeping the histogram points of the latest export per service."""
    latest: dict[str, list[Point]] = {}
    seen: list[Point] = []

    def accept(path: str, data: bytes) -> None:
        if path != "/v1/metrics":
            return
        body = ExportMetricsServiceRequest.FromString(data)
        for rm in body.resource_metrics:
            service = next(a.value.string_value for a in rm.resource.attributes
                           if a.key == "service.name")
            latest[service] = [
                (service, m.name, {a.key: a.value.string_value for a in p.attributes}, p)
                for sm in rm.scope_metrics for m in sm.metrics
                if m.WhichOneof("data") == "histogram" for p in m.histogram.data_points]
        seen[:] = [p for points in latest.values() for p in points]

    async with otlp_sink(accept) as (endpoint, _):
        yield endpoint, seen


@pytest.mark.timeout(120)
async def test_the_services_export_their_histograms_with_the_sdks_shape(tmp_path: Path) -> None:
    async with otlp_metrics() as (endpoint, seen):
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
               "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
               "OTEL_TRACES_EXPORTER": "none", "OTEL_METRIC_EXPORT_INTERVAL": "200"}
        async with DevStack(tmp_path, brains=1, hands=1, relays=1, mail_persist=False,
                            env=env) as stack:
            client = await bench_client(stack)
            try:
                await session_call(client, FIVE)(0)
            finally:
                await client.close()

            def exported(service: str, name: str, at_least: int) -> Point | None:
                for point in seen:
                    if point[:2] == (service, name) and point[3].count >= at_least:
                        return point
                return None

            # Five tool messages handled and five claims of a dispatched run in the Hands;
            # the wakes in the Brain, and its two model calls and handoffs.
            _, _, attrs, tools = await eventually(
                lambda: exported("baton-hands", "messaging.process.duration", 5), timeout=30)
            assert attrs["baton.role"] == "hands" and attrs["messaging.system"] == "nats"
            _, _, hop, _ = await eventually(
                lambda: exported("baton-hands", "baton.handoff.duration", 5), timeout=30)
            assert hop == {"baton.hop": "dispatch"}
            await eventually(lambda: exported("baton-brain", "messaging.process.duration", 1),
                             timeout=30)
            await eventually(
                lambda: exported("baton-brain", "gen_ai.client.operation.duration", 2),
                timeout=30)

            def brain_hop(hop: str) -> Point | None:
                return next((p for p in seen if p[:3] == ("baton-brain", "baton.handoff.duration",
                                                          {"baton.hop": hop})), None)

            # The session's two wakes into the Brain: its submit, then the tools' results.
            await eventually(lambda: brain_hop("submit"), timeout=30)
            await eventually(lambda: brain_hop("wake"), timeout=30)
    assert list(tools.explicit_bounds)[:3] == [0.005, 0.01, 0.025]
    assert len(tools.bucket_counts) == len(tools.explicit_bounds) + 1
    assert sum(tools.bucket_counts) == tools.count
    assert 0 <= tools.min <= tools.max and tools.min * tools.count <= tools.sum
