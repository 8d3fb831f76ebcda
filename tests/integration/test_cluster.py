"""Production-shaped failures: a NATS node dies, Redis restarts; no accepted work is lost.

A 3-node JetStream cluster (``sync_interval: always``) with streams of 3 replicas, Redis with
``appendonly yes`` / ``appendfsync always``, and Brain, two Hands and two relays in-process.
Several five-notice sessions run while one NATS node (the tool stream's leader) is killed,
or while Redis is SIGKILLed and restarted on its data; every session completes and every
recipient gets exactly one mail.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from baton.brain.worker import BrainWorker
from baton.bus.bus import Bus
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.devkit.servers import NatsCluster, RedisServer
from baton.examples.notices import app
from baton.hands.worker import HandsWorker
from baton.models import Submission
from baton.relay.worker import Relay
from baton.settings import Settings
from tests.helpers import eventually
from tests.integration.test_e2e_inprocess import running

pytestmark = pytest.mark.slow

SESSIONS = 4


def notice(n: int) -> str:
    to = ", ".join(f"p{n}-{i}@example.com" for i in range(5))
    return f"Send the approved notice to {to}, then summarise."


@pytest.fixture(scope="module")
async def cluster() -> AsyncIterator[NatsCluster]:
    async with NatsCluster(durable=True) as c:
        yield c


@pytest.fixture
async def durable_redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    async with RedisServer(tmp_path / "redis", durable=True) as server:
        yield server


@pytest.fixture
async def mailbox() -> AsyncIterator[MailboxServer]:
    async with MailboxServer(delay_ms=150) as server:  # mails in flight when things break
        yield server


def services(settings: Settings) -> list[BrainWorker | HandsWorker | Relay]:
    def named(name: str) -> Settings:
        return settings.model_copy(update={"worker_name": name})

    return [Relay(named("relay-1")), Relay(named("relay-2")), HandsWorker(named("hands-1"), app),
            HandsWorker(named("hands-2"), app), BrainWorker(named("brain-1"), app)]


def cluster_settings(redis_url: str, nats_url: str, mail_url: str) -> Settings:
    return Settings(
        redis_url=redis_url, nats_url=nats_url, mail_url=mail_url,
        namespace="c" + uuid.uuid4().hex[:8], stream_replicas=3, ack_wait_s=3.0,
        attempt_ttl_ms=1500, lease_ms=2000, progress_deadline_ms=4000,
    )


async def submit_all(client: Client) -> list[Submission]:
    subs = []
    for n in range(SESSIONS):
        sub, _ = await client.submit(notice(n), agent="notices", request_id=f"req-{n}")
        subs.append(sub)
    return subs


async def check_exactly_once(client: Client, subs: list[Submission],
                             mailbox: MailboxServer) -> None:
    finals = await asyncio.gather(*(client.wait(s, timeout=45) for s in subs))
    assert [f.status for f in finals] == ["completed"] * SESSIONS, finals
    for n, final in enumerate(finals):
        assert final.answer and final.answer.count(": sent") == 5, final.answer
        # The same request id still maps to the same, settled submission.
        again, created = await client.submit(notice(n), agent="notices",
                                             session_id=final.session_id, request_id=f"req-{n}")
        assert not created and again.id == final.id
    deliveries = Counter(op.to for op in mailbox.operations.values())
    assert len(deliveries) == 5 * SESSIONS
    assert all(count == 1 for count in deliveries.values()), deliveries


async def test_killing_a_nats_node_loses_no_accepted_work(
    cluster: NatsCluster, durable_redis: RedisServer, mailbox: MailboxServer
) -> None:
    settings = cluster_settings(durable_redis.url, cluster.url, mailbox.url)
    async with running(*services(settings)):
        bus = await Bus.connect(settings, "observer")
        js = bus.nc.jetstream()
        info = await js.stream_info(bus.names.tool_stream)
        assert info.config.num_replicas == 3 and info.cluster is not None
        client = await Client.connect(settings)
        try:
            subs = await submit_all(client)
            await eventually(lambda: mailbox.operations, timeout=20,
                             message="mail being sent")
            leader = (await js.stream_info(bus.names.tool_stream)).cluster.leader
            victim = cluster.node(str(leader))
            victim.kill()  # the tool stream's leader, mid-run
            await bus.close()
            await check_exactly_once(client, subs, mailbox)
        finally:
            await client.close()
    await victim.restart()  # the module's cluster is whole again for the next test
    await cluster.wait_ready()


async def test_redis_restart_with_aof_always_loses_no_committed_state(
    cluster: NatsCluster, durable_redis: RedisServer, mailbox: MailboxServer
) -> None:
    settings = cluster_settings(durable_redis.url, cluster.url, mailbox.url)
    async with running(*services(settings)):
        client = await Client.connect(settings)
        try:
            subs = await submit_all(client)
            await eventually(lambda: mailbox.operations, timeout=20,
                             message="mail being sent")
            receipts_before = {s.session_id: len(await client.store.receipts(s.session_id))
                               for s in subs}
            durable_redis.kill()  # SIGKILL: only what was fsynced survives
            await client.close()
            await durable_redis.restart()
            client = await Client.connect(settings)  # a client reconnects at any time
            for sub in subs:  # every accepted submission and every receipt survived
                assert (await client.store.inbox.submission(sub.session_id, sub.id)).id == sub.id
                after = await client.store.receipts(sub.session_id)
                assert len(after) >= receipts_before[sub.session_id]
            await check_exactly_once(client, subs, mailbox)
        finally:
            await client.close()
