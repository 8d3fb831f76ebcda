"""The ``baton.backlog`` gauge (``baton_backlog{stream,consumer,tenant}`` in Prometheus): the
work waiting for Brains and Hands that the autoscalers of deploy/k8s/scaling/ read, sampled
by the relay from real NATS and Redis servers.

A durable consumer's row is the lag KEDA's NATS JetStream scaler computes from the server's
monitoring endpoint (``num_pending + num_ack_pending`` of the consumer), checked here against
the consumer's info on the same server; a tenant's row is its new sessions waiting for
admission. A series once seen reads 0 when its work is gone.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis

from baton.bus.bus import Bus
from baton.bus.subjects import BusNames
from baton.client import Client
from baton.observability.tracing import sample_backlog, work_backlog
from baton.settings import Settings
from baton.store.admission import AdmissionQueue
from tests.integration.confinement import Confined
from tests.otel_host import host_telemetry, metric_points

TEXT = "Say hello."


class _NoOutbox:
    """The outbox part of the sampler, empty (this test is about the work gauge)."""

    async def backlog(self) -> list[Any]:
        return []


async def _one_round(_every_s: float) -> bool:
    return True  # stop after the round that just ran: no waiting, no clock


def _rows(reader: Any) -> dict[tuple[str, str, str], int]:
    return {(p.attributes["stream"], p.attributes["consumer"], p.attributes["tenant"]): p.value
            for p in metric_points(reader).get("baton.backlog", [])}


async def test_the_relay_samples_the_backlog_the_scalers_read(settings: Settings) -> None:
    settings = settings.model_copy(update={"admission_window": 1, "shards": 1})
    names = BusNames(settings.namespace)
    bus = await Bus.connect(settings, "backlog-test")
    client = await Client.connect(settings)
    redis = aioredis.Redis.from_url(settings.redis_url)
    try:
        await bus.ensure_streams()
        js = bus.nc.jetstream()
        # No Brain runs: of acme's three sessions one starts, two wait; globex's one waits.
        for tenant, n in (("acme", 3), ("globex", 1)):
            for _ in range(n):
                await client.submit(TEXT, agent="notices", tenant=tenant)
        for _ in range(2):
            await js.publish(names.wake_subject("notices", 1), b"{}")
        for _ in range(3):
            await js.publish(names.tool_subject("send_email"), b"{}")
        # A Hands holds one tool message in a slot (delivered, not acked): still waiting work.
        sub = await js.pull_subscribe(names.tool_subject("send_email"),
                                      durable=names.tool_durable("send_email"),
                                      stream=names.tool_stream)
        (held,) = await sub.fetch(1, timeout=5)
        info = await js.consumer_info(names.tool_stream, names.tool_durable("send_email"))
        keda_lag = info.num_pending + info.num_ack_pending  # what the scaler computes
        assert (info.num_pending, info.num_ack_pending) == (2, 1)

        admission = AdmissionQueue(client.store.redis, client.store.keys, settings)
        with host_telemetry() as host:
            await sample_backlog(_NoOutbox(), _one_round,
                                 work=lambda: work_backlog(js, names, admission))
            rows = _rows(host.metrics)
            assert rows == {
                (names.wake_stream, "wake_notices_1", ""): 2,
                (names.tool_stream, "tool_send_email", ""): keda_lag,
                ("admission", "", "acme"): 3,
                ("admission", "", "globex"): 1,
            }
            # The work is done: every series stays, at 0.
            await held.ack_sync()
            for msg in await sub.fetch(2, timeout=5):
                await msg.ack_sync()
            await js.purge_stream(names.wake_stream)
            for shard in range(settings.shards):
                await redis.delete(client.store.keys.admission(shard)[0])
            await sample_backlog(_NoOutbox(), _one_round,
                                 work=lambda: work_backlog(js, names, admission))
            assert _rows(host.metrics) == dict.fromkeys(rows, 0)
        await sub.unsubscribe()
    finally:
        await redis.aclose()
        await client.close()
        await bus.close()


async def test_the_relay_reads_the_tenants_waiting_under_its_own_user(
        confined: Confined) -> None:
    """The relay's ACL (deploy/redis/users.acl) reads the shards' admission counts."""
    settings = Settings(namespace=confined.namespace)
    admin = confined.connect("admin")
    relay = confined.connect("relay")
    adm = confined.keys.admission(0)[0]
    await admin.hset(adm, mapping={"n": 2, "n:acme": 2})
    try:
        assert await AdmissionQueue(relay, confined.keys, settings).tenants() == {"acme": 2}
    finally:
        await admin.delete(adm)
        await asyncio.gather(relay.aclose(), admin.aclose())
