"""Hostile and broken input: bad messages, forged fences, oversized payloads.

Every bad input ends in a clear error or a dead-letter record with its reason; no worker
crashes and good work behind the bad input still completes. (Tool-side cases: invalid
arguments, unknown tools, huge outputs, undecodable tool messages, are in test_hands.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats.js.errors
import pytest

from baton.brain.worker import BrainWorker
from baton.bus.bus import Bus
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.errors import PayloadTooLarge, StaleAttemptError, StaleFenceError
from baton.examples.notices import app
from baton.hands.worker import HandsWorker
from baton.models import Entry, ToolResult
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.deadletter import dead_letters
from baton.store.store import Store, worker_ref
from baton.store.writes import Writes
from tests.helpers import eventually
from tests.integration.hands_app import commit_runs, make_intent, new_id
from tests.integration.test_e2e_inprocess import FIVE, running


@pytest.fixture
async def bus(settings: Settings) -> AsyncIterator[Bus]:
    async with await Bus.connect(settings, "hostile") as b:
        await b.ensure_streams()
        yield b


BAD_WAKES = {
    "malformed": b"{not json",
    "unknown schema": b'{"v": 9, "session_id": "s1"}',
    "unknown field": b'{"v": 1, "session_id": "s1", "admin": true}',
    "forged key": b'{"v": 1, "session_id": "x}:*:meta"}',
    "not an object": b"[1, 2, 3]",
    "invalid utf-8": b'{"v": 1, "session_id": "\xff\xfe"}',
    "unknown session": b'{"v": 1, "session_id": "no-such-session"}',
}


async def test_bad_wakes_are_dead_lettered_and_the_brain_keeps_serving(
    settings: Settings, bus: Bus, store: Store
) -> None:
    async with MailboxServer() as mailbox:
        s = settings.model_copy(update={"mail_url": mailbox.url})
        brain = BrainWorker(s.model_copy(update={"worker_name": "brain-1"}), app)
        services = [Relay(s), HandsWorker(s, app), brain]
        async with running(*services):
            subject = bus.wake_subject("notices", 1)
            for name, data in BAD_WAKES.items():
                await bus.publish(subject, data, msg_id=f"bad-{name}")
            client = await Client.connect(s)
            try:
                sub, _ = await client.submit(FIVE, agent="notices")
                final = await client.wait(sub, timeout=20)
            finally:
                await client.close()

            async def all_recorded() -> list[dict[str, str]]:
                dead = await dead_letters(store.redis, store.keys)
                return dead if len(dead) >= len(BAD_WAKES) else []

            dead = await eventually(all_recorded, timeout=10, message="bad wakes dead-lettered")
        assert final.status == "completed" and mailbox.raw_requests == 5
    assert len(dead) == len(BAD_WAKES) and {d["source"] for d in dead} == {"wake"}
    reasons = sorted(d["reason"] for d in dead)
    assert sum(r.startswith("invalid Wake") for r in reasons) == len(BAD_WAKES) - 1, reasons
    unknown = [d for d in dead if d.get("session_id") == "no-such-session"]
    assert len(unknown) == 1 and "session" in unknown[0]["reason"], dead
    assert any("session_id" in r for r in reasons) and any("v: " in r for r in reasons)


async def test_a_tool_message_naming_a_forged_key_is_dead_lettered(
    settings: Settings, bus: Bus, store: Store
) -> None:
    hostile = b'{"v": 1, "session_id": "a b", "run_id": "r", "tool": "send_email"}'
    traversal = b'{"v": 1, "session_id": "s", "run_id": "r", "tool": "../send_email"}'
    async with running(HandsWorker(settings, app, ["send_email"])):
        for n, data in enumerate((hostile, traversal)):
            await bus.publish(bus.tool_subject("send_email"), data, msg_id=f"forged-{n}")
        dead = await eventually(
            lambda: _at_least(store, 2), timeout=10, message="forged tool messages dead-lettered"
        )
    assert all(d["source"] == "hands" and "invalid ToolDispatch" in d["reason"] for d in dead)


async def _at_least(store: Store, n: int) -> list[dict[str, str]]:
    dead = await dead_letters(store.redis, store.keys)
    return dead if len(dead) >= n else []


async def test_oversized_messages_are_refused_at_the_door(settings: Settings, bus: Bus) -> None:
    big = b"x" * (settings.max_payload_bytes + 1)
    with pytest.raises(PayloadTooLarge, match="exceeds"):
        await bus.publish(bus.tool_subject("send_email"), big, msg_id="big")
    # Bypassing the client-side check, the stream itself refuses it with its reason.
    js = bus.nc.jetstream()
    with pytest.raises(nats.js.errors.APIError, match="maximum"):
        await js.publish(bus.tool_subject("send_email"), big)


async def test_forged_and_stale_fences_are_refused_with_their_facts(
    settings: Settings, bus: Bus, store: Store
) -> None:
    session = new_id("s")
    intent = make_intent(bus, session, "send_email", {"to": "a@example.com", "subject": "s",
                                                      "body": "b"})
    await commit_runs(store, bus, session, [intent])  # a Brain holds fence 1
    brain = worker_ref("brain", "brain-t")
    forger = worker_ref("brain", "forger")
    writes = Writes(entries=[Entry(kind="model", text="forged")])
    with pytest.raises(StaleFenceError) as ahead:  # a guessed future fence
        await store.commit(session, 99, writes, forger)
    assert (ahead.value.fields["presented"], ahead.value.fields["current"]) == (99, 1)
    with pytest.raises(StaleFenceError):  # an old one
        await store.commit(session, 0, writes, forger)
    claim = await store.runs.claim(session, intent.run_id, worker_ref("hands", "h1"))
    result = ToolResult(outcome="ok", output={"forged": True}, attempt=claim.attempt + 5)
    with pytest.raises(StaleAttemptError) as attempt:
        await store.runs.complete(session, intent, claim.attempt + 5, result,
                             worker_ref("hands", "forger"))
    assert attempt.value.fields["current"] == claim.attempt
    state = await store.load(session)
    assert [e.text for e in state.entries] == ["go"]  # nothing forged landed
    assert state.runs[intent.run_id].status == "running"
    refused = [r for r in await store.receipts(session) if r.kind == "refused"]
    assert len(refused) == 3 and {r.worker.name for r in refused if r.worker} == {"forger"}
    # The real holders still work.
    seq, _ = await store.commit(session, 1, Writes(entries=[Entry(kind="model", text="ok")]),
                                brain)
    assert seq > 0
