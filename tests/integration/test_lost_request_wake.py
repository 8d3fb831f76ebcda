"""A client's request whose wake is lost is still taken up: a request arms no timer (the
client writes no shard-wide key but the wakes stream), so the relay's inbox sweep finds the
session whose inbox holds it and arms its progress deadline, which wakes it. The periodic
sweep looks only at the sessions whose request wakes the relay published since the last one
(the shard's ``requested`` set); the keyspace is scanned once, for the shards a relay takes."""

from __future__ import annotations

from json import dumps
from typing import Any

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
        # the scan of the shards just taken is done: the request is found by the index
        every_shard = frozenset(range(settings.shards))
        await eventually(lambda: relay.timers.swept == every_shard, message="shards swept")
        client = await Client.connect(settings)
        try:
            sub, _ = await client.submit("Say hello.", agent="notices")
            assert relay.bus is not None
            js = relay.bus.nc.jetstream()
            stream = relay.bus.names.wake_stream

            async def published() -> bool:
                return (await js.stream_info(stream)).state.messages >= 1
            await eventually(published, timeout=30, message="the submit's wake published")
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


async def test_the_periodic_sweep_reads_the_requested_sessions_not_the_keyspace(
    settings: Settings, redis: Any
) -> None:
    """The relay indexes a request's session when it acknowledges the published wake; its
    next sweep arms the session's deadline from that index and drops it from the index,
    without a SCAN of the keyspace (which costs Redis about a second per million keys)."""
    # a lease that cannot lapse on a loaded machine: a shard lost and taken again is
    # scanned again, which is not what this test looks at
    settings = settings.model_copy(update={"relay_sweep_ms": 100, "lease_ms": 30_000,
                                           "progress_deadline_ms": 60_000})
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))

    async def scans() -> int:
        return int((await redis.info("commandstats")).get("cmdstat_scan", {}).get("calls", 0))

    every_shard = frozenset(range(settings.shards))
    async with running(relay):
        # the scan of the shards just taken is behind us (all of them: on a loaded machine
        # the relay may take them over more than one look)
        await eventually(lambda: relay.timers.swept == every_shard, message="shards swept")
        before = await scans()
        client = await Client.connect(settings)
        try:
            sub, _ = await client.submit("Say hello.", agent="notices")
            sk = client.store.keys.session(sub.session_id)
            requested = client.store.keys.requested(sk.shard)
            deadline = f"deadline|{sub.session_id}|-|"

            async def armed() -> bool:
                members = await redis.zrange(sk.timers, 0, -1)
                return any(m.decode().startswith(deadline) for m in members)

            # published, indexed, then swept: armed and out of the index
            await eventually(armed, message="the request's deadline armed by a sweep")
            await eventually(lambda: _absent(redis, requested, sub.session_id),
                             message="the session dropped from the requested set")
            assert await client.store.redis.exists(sk.inbox)  # no Brain: still waiting
        finally:
            await client.close()
    assert await scans() == before


async def test_a_request_whose_wake_row_was_deleted_is_found_by_the_periodic_scan(
    settings: Settings, redis: Any
) -> None:
    """A request whose wake row was deleted before a relay read it (a role that may append
    to the wakes stream may also trim it) is in no index: the relay's scan of the keyspace,
    every ``relay_scan_ms``, finds its inbox and arms the session's deadline."""
    settings = settings.model_copy(update={"relay_sweep_ms": 100, "relay_scan_ms": 1_000,
                                           "timer_idle_tick_ms": 200,  # an idle relay looks
                                           "progress_deadline_ms": 60_000})
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    async with running(relay):
        every_shard = frozenset(range(settings.shards))
        await eventually(lambda: relay.timers.swept == every_shard, message="shards swept")
        assert relay.keys is not None
        sk = relay.keys.session("trimmed-1")
        wake = "wake.notices.1"
        # what submit.lua leaves once its wake row is gone: the request in the inbox only
        await redis.hset(sk.inbox, "submit:r1", dumps({"agent": "notices", "compat": 1,
                                                       "wake": wake}))

        async def armed() -> bool:
            return await redis.zscore(sk.timers, f"deadline|trimmed-1|-|{wake}") is not None

        await eventually(armed, message="the deadline armed by the periodic scan")
        assert await redis.zscore(relay.keys.requested(sk.shard), "trimmed-1") is None


async def _absent(redis: Any, key: str, member: str) -> bool:
    return await redis.zscore(key, member) is None


def relay_box(relay: Relay):  # type: ignore[no-untyped-def]
    from baton.store.outbox import Outbox
    assert relay._redis is not None
    return Outbox(relay._redis, relay.keys)
