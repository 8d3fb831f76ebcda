"""Brain, Hands and Relay in one event loop against real servers: the five-notice flow.

The five-notice test runs on both topologies: one Redis server, and a 3+3 Redis Cluster
(shared by the run, see ``redis_cluster`` in tests/conftest.py).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from baton.brain.worker import BrainWorker
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.examples.notices import app
from baton.hands.worker import HandsWorker
from baton.relay.worker import Relay
from baton.settings import Settings
from tests.conftest import TOPOLOGIES
from tests.helpers import eventually, running, trio

FIVE = ("Send the approved notice to ada@example.com, grace@example.com, linus@example.com, "
        "margaret@example.com and barbara@example.com, then summarise.")


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_five_notices_complete_with_one_delivery_each(
    topology: str, topo_settings: Settings, mailbox: MailboxServer
) -> None:
    settings = topo_settings.model_copy(update={"mail_url": mailbox.url})
    async with running(*trio(settings, app)):
        client = await Client.connect(settings)
        try:
            sub, created = await client.submit(FIVE, agent="notices")
            final = await client.wait(sub, timeout=20)
            # Woken by its own session's sharded notification (not the once-a-second
            # re-read), and by nothing else.
            heard = client.notifications
            again, created_again = await client.submit(
                FIVE, agent="notices", session_id=sub.session_id, request_id=sub.request_id
            )
        finally:
            await client.close()
    assert heard == 1
    assert created and not created_again and again.id == sub.id
    assert final.status == "completed", final
    assert final.answer and final.answer.count(": sent") == 5
    async with httpx.AsyncClient() as http:
        stats = (await http.get(f"{mailbox.url}/stats")).json()
    assert stats["accepted"] == 5 and stats["raw_requests"] == 5
    assert all(n == 1 for n in stats["deliveries"].values()) and len(stats["deliveries"]) == 5


async def test_lost_tool_messages_are_dispatched_again_after_the_deadline(
    settings: Settings, mailbox: MailboxServer
) -> None:
    settings = settings.model_copy(update={"mail_url": mailbox.url, "progress_deadline_ms": 400})
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app)
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    async with running(relay, brain):
        client = await Client.connect(settings)
        try:
            sub, _ = await client.submit(FIVE, agent="notices")

            async def dispatched() -> bool:
                if not await client.store.redis.exists(
                        client.store.keys.session(sub.session_id).meta):
                    return False  # not opened by the Brain yet
                state = await client.store.load(sub.session_id)
                return len(state.runs) == 5
            await eventually(dispatched, timeout=30, message="five runs dispatched")
            js = relay.bus.nc.jetstream()
            await eventually(lambda: _stream_has(js, relay.bus.names.tool_stream, 5), timeout=30)
            await js.purge_stream(relay.bus.names.tool_stream)  # the tool messages are lost
            hands = HandsWorker(settings.model_copy(update={"worker_name": "hands-1"}), app)
            async with running(hands):
                final = await client.wait(sub, timeout=20)
            receipts = await client.store.receipts(sub.session_id)
        finally:
            await client.close()
    assert final.status == "completed" and final.answer and final.answer.count(": sent") == 5
    redispatch = [r for r in receipts if getattr(r.detail, "step", None) == "redispatch"]
    assert redispatch and redispatch[0].changes["outbox"] == 5
    async with httpx.AsyncClient() as http:
        stats = (await http.get(f"{mailbox.url}/stats")).json()
    assert stats["accepted"] == 5 and stats["raw_requests"] == 5


async def _stream_has(js, stream: str, n: int) -> bool:  # type: ignore[no-untyped-def]
    info = await js.stream_info(stream)
    return info.state.messages >= n


async def test_workers_started_before_redis_wait_for_it(
    settings: Settings, mailbox: MailboxServer
) -> None:
    from baton.devkit.servers import RedisServer, free_port

    port = free_port()
    late = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{port}/0",
                                       "mail_url": mailbox.url})
    brain = BrainWorker(late.model_copy(update={"worker_name": "brain-early"}), app)
    hands = HandsWorker(late.model_copy(update={"worker_name": "hands-early"}), app)
    relay = Relay(late.model_copy(update={"worker_name": "relay-early"}))
    tasks = [asyncio.create_task(s.serve()) for s in (brain, hands, relay)]
    try:
        # Nothing listens yet: for a while (several connect attempts) no service exits.
        done, _ = await asyncio.wait(tasks, timeout=1.0)
        assert not done and not brain.ready.is_set()
        async with RedisServer(port=port):
            await asyncio.wait_for(
                asyncio.gather(*(s.ready.wait() for s in (brain, hands, relay))), 20)
            client = await Client.connect(late)
            try:
                sub, _ = await client.submit(FIVE, agent="notices")
                final = await client.wait(sub, timeout=20)
            finally:
                await client.close()
            assert final.status == "completed"
            for s in (brain, hands, relay):
                s.shutdown()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
    finally:
        for t in tasks:
            t.cancel()


async def test_two_messages_sent_to_a_session_at_once_are_each_answered_by_their_own_task(
    settings: Settings, mailbox: MailboxServer
) -> None:
    """Both commit before a Brain takes either up: the first task's requests do not show the
    second message (its model would act on it), the second's show the first exchange whole."""
    settings = settings.model_copy(update={"mail_url": mailbox.url})
    texts = {to: f"Send the approved notice to {to}, then summarise."
             for to in ("g1@example.com", "g2@example.com")}
    client = await Client.connect(settings)
    try:
        subs = await asyncio.gather(*(
            client.submit(text, agent="notices", session_id="s-two-at-once")
            for text in texts.values()))  # no Brain yet: both wait in the inbox
        brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app)
        hands = HandsWorker(settings.model_copy(update={"worker_name": "hands-1"}), app)
        relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
        async with running(relay, hands, brain):
            finals = [await client.wait(sub, timeout=30) for sub, _ in subs]
    finally:
        await client.close()
    for to, final in zip(texts, finals, strict=True):
        assert final.status == "completed", final
        assert final.answer == f"Summary of 1 notices: {to}: sent.", final.answer
    async with httpx.AsyncClient() as http:
        stats = (await http.get(f"{mailbox.url}/stats")).json()
    assert stats["deliveries"] == {to: 1 for to in texts}
