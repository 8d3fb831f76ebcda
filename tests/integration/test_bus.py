"""The JetStream bus against a real nats-server: topology, dedupe, pull, redelivery."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.js.api import DiscardPolicy

from baton.bus import bus as bus_module
from baton.bus.bus import Bus
from baton.bus.messages import Beats, Outgoing, delivery_count, heartbeat
from baton.bus.subjects import BusNames
from baton.devkit.servers import NatsServer, free_port
from baton.errors import NatsUnavailable, PayloadTooLarge, ValidationError
from baton.settings import Settings
from tests.helpers import eventually


@pytest.fixture
async def bus(settings: Settings) -> AsyncIterator[Bus]:
    async with await Bus.connect(settings, "test") as bus:
        await bus.ensure_streams()
        yield bus


async def _tool_consumer(
    bus: Bus, tool: str, *, ack_wait: float | None = None, max_deliver: int | None = None
) -> str:
    durable = bus.names.tool_durable(tool)
    await bus.ensure_consumer(
        bus.names.tool_stream, durable, bus.tool_subject(tool),
        ack_wait=ack_wait, max_deliver=max_deliver,
    )
    return durable


def test_names_derive_from_namespace() -> None:
    names = BusNames("dev-1")
    assert names.wake_stream == "DEV_1_WAKE"
    assert names.tool_stream == "DEV_1_TOOLS"
    assert names.wake_subject("notice", 2) == "dev-1.wake.notice.2"
    assert names.tool_subject("send_email") == "dev-1.tool.send_email"
    assert names.wake_durable("notice", 2) == "wake_notice_2"
    for bad in ("a.b", "a b", "*", ">", ""):
        with pytest.raises(ValidationError):
            names.tool_subject(bad)


async def test_ensure_streams_is_idempotent(bus: Bus, settings: Settings) -> None:
    await bus.ensure_streams()
    info = await bus.nc.jetstream().stream_info(bus.names.tool_stream)
    assert info.config.retention == "workqueue"
    assert info.config.duplicate_window == settings.duplicate_window_s
    assert info.config.max_msg_size == settings.max_payload_bytes


async def test_ensure_streams_updates_changed_config(settings: Settings) -> None:
    async with await Bus.connect(settings, "a") as bus:
        await bus.ensure_streams()
    changed = settings.model_copy(update={"duplicate_window_s": 30.0, "stream_max_msgs": 500,
                                          "stream_max_bytes": 2 * 1024 * 1024,
                                          "stream_max_age_s": 3600.0})
    async with await Bus.connect(changed, "b") as bus:
        await bus.ensure_streams()
        info = await bus.nc.jetstream().stream_info(bus.names.wake_stream)
        assert info.config.duplicate_window == 30.0
        assert (info.config.max_msgs, info.config.max_bytes, info.config.max_age) == (
            500, 2 * 1024 * 1024, 3600.0)
        assert info.config.discard == DiscardPolicy.NEW


async def test_consumer_config_update_is_applied(bus: Bus) -> None:
    durable = await _tool_consumer(bus, "echo", ack_wait=5.0, max_deliver=3)
    await _tool_consumer(bus, "echo", ack_wait=5.0, max_deliver=3)  # unchanged: no-op
    info = await bus.ensure_consumer(
        bus.names.tool_stream, durable, bus.tool_subject("echo"), ack_wait=2.0, max_deliver=7
    )
    assert (info.config.ack_wait, info.config.max_deliver) == (2.0, 7)
    info = await bus.nc.jetstream().consumer_info(bus.names.tool_stream, durable)
    assert (info.config.ack_wait, info.config.max_deliver) == (2.0, 7)


async def test_republish_with_same_msg_id_is_deduplicated(bus: Bus) -> None:
    durable = await _tool_consumer(bus, "echo")
    subject = bus.tool_subject("echo")
    assert await bus.publish(subject, b"one", msg_id="row-1") is True
    assert await bus.publish(subject, b"one", msg_id="row-1") is False  # relay re-publish
    info = await bus.nc.jetstream().stream_info(bus.names.tool_stream)
    assert info.state.messages == 1
    puller = await bus.pull(bus.names.tool_stream, durable)
    msgs = await puller.fetch(10, 0.5)
    assert [m.data for m in msgs] == [b"one"]
    assert msgs[0].headers == {"Nats-Msg-Id": "row-1"}
    await puller.close()


async def test_a_batch_is_fetched_whole_and_in_order(bus: Bus) -> None:
    # The messages after a batch's first are taken from the inbox at once; none is left.
    durable = await _tool_consumer(bus, "echo")
    subject = bus.tool_subject("echo")
    for i in range(6):
        assert await bus.publish(subject, b"m%d" % i, msg_id=f"row-{i}") is True
    puller = await bus.pull(bus.names.tool_stream, durable)
    msgs = await puller.fetch(4, 1.0)
    msgs += await puller.fetch(10, 1.0)
    assert [m.data for m in msgs] == [b"m%d" % i for i in range(6)]
    for m in msgs:
        await m.ack()
    assert await puller.fetch(10, 0.2) == []
    await puller.close()


async def test_publish_many_reports_duplicates(bus: Bus) -> None:
    subject = bus.tool_subject("echo")
    await bus.publish(subject, b"x", msg_id="r1")
    items = [Outgoing(subject, b"x", f"r{i}", {"k": str(i)}) for i in range(1, 5)]
    assert await bus.publish_many(items) == [False, True, True, True]
    assert await bus.publish_many([]) == []


async def test_an_unanswered_batch_fails_and_gives_back_its_acks_places(
        bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    # No stream takes this subject but a plain subscriber hears it: no ack comes, and no
    # "no responders" either. The batch fails at its deadline, and its acks leave
    # publish_async's window (4,000 places), which would otherwise fill up for good.
    subject = f"{bus.settings.namespace}.unstored"
    listener = await bus.nc.subscribe(subject)
    monkeypatch.setattr(bus_module, "_REQUEST_TIMEOUT_S", 0.2)
    with pytest.raises(NatsUnavailable):
        await bus.publish_many([Outgoing(subject, b"x", f"u{i}") for i in range(3)])
    await eventually(lambda: bus._js.publish_async_pending() == 0)  # done callbacks: next turn
    assert await bus.publish_many([Outgoing(bus.tool_subject("echo"), b"y", "after")]) == [True]
    await listener.unsubscribe()


async def test_publish_checks_size_and_msg_id(bus: Bus, settings: Settings) -> None:
    subject = bus.tool_subject("echo")
    with pytest.raises(PayloadTooLarge):
        await bus.publish(subject, b"x" * (settings.max_payload_bytes + 1), msg_id="big")
    with pytest.raises(ValidationError):
        await bus.publish(subject, b"x", msg_id="")


async def test_fetch_on_empty_returns_nothing(bus: Bus) -> None:
    durable = await _tool_consumer(bus, "idle")
    puller = await bus.pull(bus.names.tool_stream, durable)
    assert await puller.fetch(1, 0.2) == []  # its own timeout, with nothing: no error
    assert await puller.fetch(10, 0.2) == []
    await puller.close()


async def test_fetch_returns_as_soon_as_a_message_arrives(bus: Bus) -> None:
    durable = await _tool_consumer(bus, "echo")
    puller = await bus.pull(bus.names.tool_stream, durable)
    # A fetch whose own timeout is an hour: it can only return because the message came.
    fetch = asyncio.create_task(puller.fetch(10, 3600.0))
    await bus.publish(bus.tool_subject("echo"), b"late", msg_id="late")
    async with asyncio.timeout(60):  # the test's deadline, far below the fetch's
        msgs = await fetch
    assert [m.data for m in msgs] == [b"late"]
    await msgs[0].ack_sync()
    await puller.close()


async def test_unacked_message_is_redelivered(bus: Bus) -> None:
    durable = await _tool_consumer(bus, "echo", ack_wait=0.5)
    await bus.publish(bus.tool_subject("echo"), b"work", msg_id="w1")
    puller = await bus.pull(bus.names.tool_stream, durable)
    [first] = await puller.fetch(1, 1.0)
    assert delivery_count(first) == 1
    # Not acked: after ack_wait the server delivers it again.
    [again] = await puller.fetch(1, 3.0)
    assert again.data == b"work" and delivery_count(again) == 2
    await again.ack_sync()
    await puller.close()


async def test_heartbeat_keeps_message_from_redelivery(bus: Bus) -> None:
    durable = await _tool_consumer(bus, "slow", ack_wait=1.0)
    await bus.publish(bus.tool_subject("slow"), b"job", msg_id="j1")
    worker = await bus.pull(bus.names.tool_stream, durable)
    rival = await bus.pull(bus.names.tool_stream, durable)
    [msg] = await worker.fetch(1, 1.0)
    started = time.monotonic()
    async with heartbeat(msg, 0.2):
        # Watch for 2.5 x ack_wait: a redelivery would reach the rival's fetch.
        while time.monotonic() - started < 2.5:
            assert await rival.fetch(1, 0.5) == []
    await msg.ack_sync()
    assert await rival.fetch(1, 1.5) == []  # acked: never redelivered
    await worker.close()
    await rival.close()


async def test_shared_beats_keep_every_message_in_hand_from_redelivery(bus: Bus) -> None:
    durable = await _tool_consumer(bus, "slow", ack_wait=1.0)
    for i in range(3):
        await bus.publish(bus.tool_subject("slow"), b"job", msg_id=f"b{i}")
    worker = await bus.pull(bus.names.tool_stream, durable)
    rival = await bus.pull(bus.names.tool_stream, durable)
    msgs = await worker.fetch(3, 1.0)
    assert len(msgs) == 3
    beats = Beats(0.2)
    started = time.monotonic()
    async with beats.beating(msgs[0]), beats.beating(msgs[1]), beats.beating(msgs[2]):
        # Watch for 2.5 x ack_wait: a redelivery would reach the rival's fetch.
        while time.monotonic() - started < 2.5:
            assert await rival.fetch(1, 0.5) == []
    assert beats.sent >= 3  # one loop beat all three
    for msg in msgs:
        await msg.ack_sync()
    await eventually(lambda: beats._task is not None and beats._task.done())  # nothing held
    sent = beats.sent
    assert await rival.fetch(1, 1.5) == []  # acked: never redelivered
    assert beats.sent == sent
    await beats.close()
    await worker.close()
    await rival.close()


async def test_heartbeat_stops_after_ack(bus: Bus) -> None:
    durable = await _tool_consumer(bus, "echo")
    await bus.publish(bus.tool_subject("echo"), b"x", msg_id="h1")
    puller = await bus.pull(bus.names.tool_stream, durable)
    [msg] = await puller.fetch(1, 1.0)
    async with heartbeat(msg, 0.01):
        await msg.ack_sync()
        await eventually(lambda: msg.is_acked)
    await puller.close()


async def test_connect_to_down_nats_fails_fast(settings: Settings) -> None:
    # Connect retries until connect_timeout_s (a server may be starting), then fails clearly.
    down = settings.model_copy(
        update={"nats_url": f"nats://127.0.0.1:{free_port()}", "connect_timeout_s": 1.0}
    )
    with pytest.raises(NatsUnavailable, match="cannot connect to NATS") as caught:
        async with asyncio.timeout(60):  # the test's deadline: it gives up, never retries on
            await Bus.connect(down, "test")
    assert caught.value.retryable


async def test_bus_survives_nats_restart(settings: Settings, tmp_path: Path) -> None:
    async with NatsServer(tmp_path, durable=True) as server:
        local = settings.model_copy(update={"nats_url": server.url})
        async with await Bus.connect(local, "survivor") as bus:
            await bus.ensure_streams()
            durable = await _tool_consumer(bus, "echo")
            assert await bus.publish(bus.tool_subject("echo"), b"before", msg_id="b")
            server.kill()
            await eventually(lambda: not bus.nc.is_connected, message="disconnect seen")
            await server.restart()
            await eventually(lambda: bus.nc.is_connected, message="reconnected")
            assert await bus.publish(bus.tool_subject("echo"), b"after", msg_id="a")
            puller = await bus.pull(bus.names.tool_stream, durable)
            msgs = await puller.fetch(10, 1.0)
            assert [m.data for m in msgs] == [b"before", b"after"]
            await puller.close()


async def test_a_long_poll_ends_when_the_connection_comes_back(
    settings: Settings, tmp_path: Path
) -> None:
    """The server forgets pull requests with the connection: a long poll waiting across a
    NATS restart ends at the reconnect, not at its own (hour-long) timeout, so the loop asks
    again at once and gets what is published after."""
    async with NatsServer(tmp_path, durable=True) as server:
        local = settings.model_copy(update={"nats_url": server.url})
        async with await Bus.connect(local, "poller") as bus:
            await bus.ensure_streams()
            durable = await _tool_consumer(bus, "echo")
            puller = await bus.pull(bus.names.tool_stream, durable)
            stop = asyncio.Event()
            polling = asyncio.create_task(puller.fetch(1, 3600.0, stop=stop))
            server.kill()
            await eventually(lambda: not bus.nc.is_connected, message="disconnect seen")
            await server.restart()
            async with asyncio.timeout(30):
                assert await polling == []
            assert await bus.publish(bus.tool_subject("echo"), b"after", msg_id="a")
            async with asyncio.timeout(30):
                msgs = await puller.fetch(1, 3600.0, stop=stop)
            assert [m.data for m in msgs] == [b"after"]
            await msgs[0].ack_sync()
            await puller.close()



async def _waiting_requests(bus: Bus, durable: str) -> int:
    info = await bus.nc.jetstream().consumer_info(bus.names.tool_stream, durable)
    return int(info.num_waiting or 0)


async def test_a_long_poll_hands_over_its_first_message_at_once_and_leaves_no_request(
        bus: Bus) -> None:
    # nats-py's fetch, when its long poll had brought one message, could wait for the
    # whole batch or the end of the timeout (seen with two Brains on one consumer: a wake
    # held past ack_wait came back to the other Brain and its session stalled for
    # seconds). The long poll returns what has come the moment something has, and its
    # request ends with it: nothing is left waiting on the server for more.
    durable = await _tool_consumer(bus, "trickle")
    puller = await bus.pull(bus.names.tool_stream, durable)

    async def long_poll_open() -> bool:
        return await _waiting_requests(bus, durable) == 1

    async with asyncio.timeout(30):  # far below the fetches' own 60 s
        for i in range(3):
            fetch = asyncio.create_task(puller.fetch(8, 60.0))
            await eventually(long_poll_open)
            await bus.publish(bus.tool_subject("trickle"), b"m%d" % i, msg_id=f"t{i}")
            msgs = await fetch
            assert [m.data for m in msgs] == [b"m%d" % i]
            await msgs[0].ack_sync()
            assert await _waiting_requests(bus, durable) == 0
    await puller.close()


async def test_what_the_stream_holds_is_fetched_up_to_the_batch_and_the_rest_next_time(
        bus: Bus) -> None:
    durable = await _tool_consumer(bus, "held")
    for i in range(5):
        await bus.publish(bus.tool_subject("held"), b"h%d" % i, msg_id=f"h{i}")
    puller = await bus.pull(bus.names.tool_stream, durable)
    async with asyncio.timeout(30):
        first = await puller.fetch(3, 60.0)
        rest = await puller.fetch(8, 60.0)  # two left: the no_wait request's 404 ends it
    assert [m.data for m in first + rest] == [b"h%d" % i for i in range(5)]
    assert await _waiting_requests(bus, durable) == 0
    for m in first + rest:
        await m.ack_sync()
    await puller.close()


async def test_a_long_poll_under_unacked_messages_hands_over_the_next_one_at_once(
        bus: Bus) -> None:
    # A busy worker fetches while it holds messages not yet acked: each message that
    # comes is handed over at once, never held back for the rest of the batch.
    durable = await _tool_consumer(bus, "busy")
    puller = await bus.pull(bus.names.tool_stream, durable)
    await bus.publish(bus.tool_subject("busy"), b"in hand", msg_id="b0")
    async with asyncio.timeout(20):  # far below the fetches' own 60 s
        [held] = await puller.fetch(8, 60.0)  # not acked while the next comes
        for i in range(3):
            fetch = asyncio.create_task(puller.fetch(8, 60.0))
            await eventually(lambda: _waiting_requests(bus, durable))
            await bus.publish(bus.tool_subject("busy"), b"m%d" % i, msg_id=f"b{i + 1}")
            msgs = await fetch
            assert [m.data for m in msgs] == [b"m%d" % i]
            await msgs[0].ack_sync()
    await held.ack_sync()
    await puller.close()
