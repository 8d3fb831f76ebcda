"""A client's request whose wake is lost is still taken up: a request arms no timer (the
client writes no shard-wide key but the wakes stream), so the relay's inbox sweep finds the
session whose inbox holds it and arms its progress deadline, which wakes it."""

from __future__ import annotations

import pytest

from baton.brain.worker import BrainWorker
from baton.client import Client
from baton.examples.notices import app
from baton.relay.worker import Relay
from baton.settings import Settings
from tests.helpers import eventually, running

pytestmark = pytest.mark.timeout(60)


async def test_a_request_whose_wake_message_is_lost_is_taken_up(settings: Settings) -> None:
    """The relay published the submit's wake, then the message was lost (here: the wake
    stream purged) before any Brain took it; the next sweep wakes the session anyway."""
    settings = settings.model_copy(update={"relay_sweep_ms": 300, "progress_deadline_ms": 400})
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app)
    async with running(relay):
        client = await Client.connect(settings)
        try:
            sub, _ = await client.submit("Say hello.", agent="notices")
            assert relay.bus is not None
            js = relay.bus.nc.jetstream()
            stream = relay.bus.names.wake_stream

            async def published() -> bool:
                return (await js.stream_info(stream)).state.messages >= 1
            await eventually(published, message="the submit's wake published")
            await js.purge_stream(stream)  # the wake is lost (the submit armed no timer)
            # listed in the shard's index by the relay (the client writes no index)
            sk = client.store.keys.session(sub.session_id)
            assert await client.store.redis.zscore(sk.sessions, sub.session_id) is not None
            async with running(brain):
                final = await client.wait(sub, timeout=30)
        finally:
            await client.close()
    assert final.status == "completed", final
    assert relay.counts.timers_fired >= 1


async def test_a_request_taken_up_arms_nothing_more(settings: Settings, redis: object) -> None:
    """Once a Brain took the requests up, a sweep finds no inbox and arms no timer."""
    settings = settings.model_copy(update={"relay_sweep_ms": 100})
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app)
    async with running(relay, brain):
        client = await Client.connect(settings)
        try:
            sub, _ = await client.submit("Say hello.", agent="notices")
            final = await client.wait(sub, timeout=30)
            sk = client.store.keys.session(sub.session_id)
            assert final.status == "completed", final
            assert not await client.store.redis.exists(sk.inbox)
            box = relay_box(relay)
            assert await box.waiting_requests(list(range(settings.shards))) == {}
        finally:
            await client.close()


def relay_box(relay: Relay):  # type: ignore[no-untyped-def]
    from baton.store.outbox import Outbox
    assert relay._redis is not None
    return Outbox(relay._redis, relay.keys)
