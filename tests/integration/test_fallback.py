"""Delivery around streams and consumers without a leader (baton.bus.fallback), on a real
3-node JetStream cluster.

Each test makes one node lead every Raft group of the namespace (the two streams and their
consumers, by a leader step-down naming it), then kills that node and a second one. The
node left cannot elect anyone (no quorum): the streams refuse every publish (503) and the
consumers deliver nothing for as long as the test runs, so nothing here races an election.
That is more than losing one node of three, where the same state lasts the 4 to 9 s of an
election (``baton bench nodeloss`` measures that case); the paths around JetStream are the
same. Once the nodes are back, JetStream delivers every stored message again, and the
duplicates change nothing.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient

from baton.brain.worker import BrainWorker
from baton.bus.bus import Bus
from baton.bus.fallback import FallbackMsg, is_fallback
from baton.bus.pull import Puller
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.devkit.servers import NatsCluster, RedisServer
from baton.examples.notices import app
from baton.hands.worker import HandsWorker
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.outbox import Outbox
from tests.helpers import eventually, running

pytestmark = pytest.mark.slow

LEADER = "n1"


@pytest.fixture
async def cluster() -> AsyncIterator[NatsCluster]:
    async with NatsCluster(durable=False) as c:
        yield c


def cluster_settings(cluster: NatsCluster, redis: RedisServer, **extra: object) -> Settings:
    return Settings(redis_url=redis.url, nats_url=cluster.url,
                    namespace="f" + uuid.uuid4().hex[:8], stream_replicas=3, **extra)


async def _leader_of(nc: NatsClient, subject: str) -> str:
    reply = await nc.request(subject, b"", timeout=2)
    return str((json.loads(reply.data).get("cluster") or {}).get("leader") or "")


async def lead_everything_on(nc: NatsClient, bus: Bus, node: str) -> list[str]:
    """Make ``node`` lead both streams of the namespace and each of their consumers;
    return the groups (stream, or stream/consumer)."""
    groups: list[tuple[str, str]] = []
    js = nc.jetstream(timeout=2)
    for stream in (bus.names.wake_stream, bus.names.tool_stream):
        groups.append((f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}"))
        for name in await js.consumers_info(stream):
            consumer = name.name
            groups.append((f"$JS.API.CONSUMER.INFO.{stream}.{consumer}",
                           f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}"))
    preferred = json.dumps({"placement": {"preferred": node}}).encode()
    for info, stepdown in groups:
        async def led(info: str = info, stepdown: str = stepdown) -> bool:
            if await _leader_of(nc, info) == node:
                return True
            try:  # answered by the current leader; an election may be under way meanwhile
                await nc.request(stepdown, preferred, timeout=2)
            except nats.errors.Error:
                pass
            return False
        await eventually(led, timeout=60, interval=0.2, message=f"{node} leading {info}")
    return [info.removeprefix("$JS.API.").split(".", 2)[2] for info, _ in groups]


async def kill_leader_and_quorum(cluster: NatsCluster) -> None:
    """Kill the node leading everything and one more: the last one cannot elect."""
    cluster.node(LEADER).kill()
    cluster.node("n2").kill()


async def restart(cluster: NatsCluster) -> None:
    await cluster.node(LEADER).restart()
    await cluster.node("n2").restart()
    await cluster.wait_ready()


async def fetched(puller: Puller) -> list[Any]:
    """A fetch as a worker's loop makes it: an error while the nodes die or come back (no
    responders for the JetStream API, say) is a fetch that brought nothing; the loop asks
    again."""
    try:
        return list(await puller.fetch(10, timeout=1))
    except (nats.errors.Error, TimeoutError):
        return []


async def test_a_puller_reads_around_a_consumer_without_leader(
    cluster: NatsCluster, redis_server: RedisServer
) -> None:
    settings = cluster_settings(cluster, redis_server, ack_wait_s=2.0)
    bus = await Bus.connect(settings, "test")
    try:
        await bus.ensure_streams()
        stream, subject = bus.names.tool_stream, bus.names.tool_subject("t")
        await bus.ensure_consumer(stream, "tool_t", subject)
        for i in range(3):
            await bus.publish(subject, b"m%d" % i, msg_id=f"id-{i}")
        puller = await bus.pull(stream, "tool_t", subject)
        held = await puller.fetch(1, timeout=10)  # in hand here, never acknowledged
        assert [m.data for m in held] == [b"m0"] and not is_fallback(held[0])
        await lead_everything_on(bus.nc, bus, LEADER)
        await kill_leader_and_quorum(cluster)

        read: list[FallbackMsg] = []

        async def around() -> bool:
            read.extend(m for m in await fetched(puller) if isinstance(m, FallbackMsg))
            return len(read) >= 2
        await eventually(around, timeout=60, message="messages read around the consumer")
        # The two it never delivered, read from the stream's last replica; not the one in
        # hand here. Acknowledging a copy does nothing (and raises nothing).
        assert puller.around
        assert sorted(m.data for m in read) == [b"m1", b"m2"]
        assert [m.metadata.num_delivered for m in read] == [1, 1]
        assert sorted(m.metadata.sequence.stream for m in read) == [2, 3]
        for m in read:
            await m.ack()
            assert m.is_acked

        await restart(cluster)
        # The consumer is back: it delivers all three again (the copies' acks were no-ops,
        # m0 after its ack_wait), as JetStream messages; nothing was lost.
        again: list[bytes] = []

        async def delivered() -> bool:
            for m in await fetched(puller):
                if not is_fallback(m):
                    again.append(m.data)
                    await m.ack()
            return sorted(again) == [b"m0", b"m1", b"m2"]
        await eventually(delivered, timeout=60, message="the stored messages delivered")
        assert not puller.around
        await puller.close()
    finally:
        await bus.close()


async def test_sessions_complete_while_no_stream_or_consumer_has_a_leader(
    cluster: NatsCluster, redis_server: RedisServer
) -> None:
    """Five-notice sessions run start to end through the relay's copies and the workers'
    reads around their consumers; one mail per recipient, also after JetStream delivers the
    stored messages once the nodes are back."""
    async with MailboxServer() as mailbox:
        settings = cluster_settings(cluster, redis_server, mail_url=mailbox.url)

        def named(name: str) -> Settings:
            return settings.model_copy(update={"worker_name": name})

        relays = [Relay(named("relay-1")), Relay(named("relay-2"))]
        services = [*relays, HandsWorker(named("hands-1"), app),
                    HandsWorker(named("hands-2"), app), BrainWorker(named("brain-1"), app)]
        async with running(*services):
            bus = await Bus.connect(settings, "observer")
            client = await Client.connect(settings)
            try:
                first, _ = await client.submit(notice(0), agent="notices")
                assert (await client.wait(first, timeout=60)).status == "completed"
                groups = await lead_everything_on(bus.nc, bus, LEADER)
                assert len(groups) >= 4  # two streams, the wake consumer, the tools'
                await kill_leader_and_quorum(cluster)

                subs = [(await client.submit(notice(n), agent="notices"))[0]
                        for n in range(1, 4)]
                finals = [await client.wait(s, timeout=90) for s in subs]
                assert [f.status for f in finals] == ["completed"] * 3, finals
                assert sum(r.counts.sent_around for r in relays) > 0
                published = sum(r.counts.published for r in relays)
                counts = Counter(op.to for op in mailbox.operations.values())
                assert len(counts) == 5 * 4 and set(counts.values()) == {1}, counts

                await restart(cluster)
                # The rows sent around stayed in the outbox: the relays now publish them,
                # the workers get the stored messages and turn them away (already done).
                js = bus.nc.jetstream(timeout=2)
                outbox = Outbox(client.store.redis, client.store.keys)

                async def drained() -> bool:
                    if sum(b.rows for b in await outbox.backlog()):
                        return False  # rows not yet taken by a stream
                    left = 0
                    for stream in (bus.names.wake_stream, bus.names.tool_stream):
                        try:
                            left += (await js.stream_info(stream)).state.messages
                        except nats.errors.Error:
                            return False
                    return left == 0
                await eventually(drained, timeout=90, interval=0.2,
                                 message="the stored messages delivered and acknowledged")
                assert sum(r.counts.published for r in relays) > published
                counts = Counter(op.to for op in mailbox.operations.values())
                assert len(counts) == 5 * 4 and set(counts.values()) == {1}, counts
            finally:
                await client.close()
                await bus.close()


def notice(n: int) -> str:
    to = ", ".join(f"f{n}-{i}@example.com" for i in range(5))
    return f"Send the approved notice to {to}, then summarise."
