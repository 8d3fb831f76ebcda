"""The Hands worker against real Redis, NATS and the bundled mail service: the happy path
and recovery per replay policy. The app, fixtures and helpers are in
:mod:`tests.integration.hands_app`."""

from __future__ import annotations

import httpx

from baton.bus.bus import Bus
from baton.devkit.mailbox import MailboxServer
from baton.settings import Settings
from baton.store.store import Store
from tests.integration.hands_app import (
    CALLS,
    abandon,
    commit_runs,
    dispatch,
    make_intent,
    new_id,
    outbox_rows,
    result_of,
    running,
    settled,
)

# ---------------------------------------------------------------- happy path


async def test_send_email_completes_once_and_wakes_after_the_group(
    hs: Settings, store: Store, bus: Bus, mailbox: MailboxServer
) -> None:
    session = new_id("s")
    intents = [
        make_intent(bus, session, "send_email",
                    {"to": f"c{i}@example.com", "subject": "Notice", "body": "Hello"}, group="g")
        for i in range(2)
    ]
    await commit_runs(store, bus, session, intents, groups={"g": 2})
    async with running(hs):
        await dispatch(bus, intents[0])
        first = await result_of(store, intents[0])
        assert not any('"tool:' in r.data for r in await outbox_rows(store, session))
        await dispatch(bus, intents[1])
        second = await result_of(store, intents[1])
        await settled(bus, "send_email")

    for intent, result in zip(intents, (first, second), strict=True):
        assert result.ok and result.recovery == "none" and result.attempt == 1
        assert result.output["status"] == "delivered"
        assert result.output["operation_id"] == intent.operation_id
    assert mailbox.raw_requests == 2 and len(mailbox.operations) == 2
    marks = {(m.run_id, m.mark) for r in await store.receipts(session) for m in r.marks}
    for intent in intents:
        assert {(intent.run_id, "accepted"), (intent.run_id, "completed")} <= marks
    wakes = [r for r in await outbox_rows(store, session) if '"tool:' in r.data]
    assert len(wakes) == 1 and intents[1].run_id in wakes[0].data  # the group's last one


async def test_a_duplicate_tool_message_executes_once(
    hs: Settings, store: Store, bus: Bus, mailbox: MailboxServer
) -> None:
    session = new_id("s")
    intent = make_intent(bus, session, "send_email",
                         {"to": "a@example.com", "subject": "Notice", "body": "Hello"})
    await commit_runs(store, bus, session, [intent])
    async with running(hs):
        await dispatch(bus, intent, msg_id="first")
        await dispatch(bus, intent, msg_id="second")  # not deduplicated by the stream
        result = await result_of(store, intent)
        await settled(bus, "send_email")
    assert result.ok and result.attempt == 1
    assert mailbox.raw_requests == 1 and len(mailbox.operations) == 1
    run = await store.runs.get(session, intent.run_id)
    assert run and run.attempt == 1


# ---------------------------------------------------------------- recovery per policy


async def test_confirm_adopts_a_send_that_already_happened(
    hs: Settings, store: Store, bus: Bus, mailbox: MailboxServer
) -> None:
    session = new_id("s")
    args = {"to": "d@example.com", "subject": "Notice", "body": "Hello"}
    intent = make_intent(bus, session, "send_email", args)
    await commit_runs(store, bus, session, [intent])
    await abandon(store, intent)
    async with httpx.AsyncClient() as http:  # the dead attempt's send reached the provider
        sent = await http.post(f"{mailbox.url}/send", json=args,
                               headers={"Idempotency-Key": intent.operation_id})
    assert sent.status_code == 200
    async with running(hs):
        await dispatch(bus, intent)
        result = await result_of(store, intent)
        await settled(bus, "send_email")
    assert result.ok and result.recovery == "confirmed" and result.attempt == 2
    assert result.output["message_id"] == sent.json()["message_id"]
    assert mailbox.raw_requests == 1  # confirmed, never re-sent
    reclaims = [r for r in await store.receipts(session) if r.kind == "reclaim"]
    assert reclaims and reclaims[0].detail.previous_worker == "hands-x"


async def test_confirm_with_nothing_found_executes_once(
    hs: Settings, store: Store, bus: Bus, mailbox: MailboxServer
) -> None:
    session = new_id("s")
    intent = make_intent(bus, session, "send_email",
                         {"to": "e@example.com", "subject": "Notice", "body": "Hello"})
    await commit_runs(store, bus, session, [intent])
    await abandon(store, intent)
    async with running(hs):
        await dispatch(bus, intent)
        result = await result_of(store, intent)
    assert result.ok and result.recovery == "executed_after_confirm"
    assert mailbox.raw_requests == 1 and list(mailbox.operations) == [intent.operation_id]


async def test_a_safe_tool_is_reexecuted(
    hs: Settings, store: Store, bus: Bus, mailbox: MailboxServer
) -> None:
    session = new_id("s")
    intent = make_intent(bus, session, "http_get", {"url": f"{mailbox.url}/healthz"})
    await commit_runs(store, bus, session, [intent])
    await abandon(store, intent)
    async with running(hs):
        await dispatch(bus, intent)
        result = await result_of(store, intent)
    assert result.ok and result.recovery == "reexecuted"
    assert result.output["status"] == 200 and '"ok"' in result.output["text"]


async def test_unsafe_and_weakened_tools_are_interrupted_without_running(
    hs: Settings, store: Store, bus: Bus
) -> None:
    session = new_id("s")
    unsafe = make_intent(bus, session, "charge", {"amount": 5})
    # Saved while the tool still said "safe"; the code running now says "unsafe".
    weakened = make_intent(bus, session, "charge", {"amount": 7}, replay="safe")
    await commit_runs(store, bus, session, [unsafe, weakened])
    for intent in (unsafe, weakened):
        await abandon(store, intent)
    async with running(hs):
        for intent in (unsafe, weakened):
            await dispatch(bus, intent)
        results = [await result_of(store, i) for i in (unsafe, weakened)]
        await settled(bus, "charge")
    for intent, result in zip((unsafe, weakened), results, strict=True):
        assert result.outcome == "interrupted" and result.recovery == "interrupted"
        assert "not safe to replay" in (result.error or "")
        assert CALLS[intent.run_id] == 0
    assert "changed from 'safe' to 'unsafe'" in (results[1].error or "")
    # Not ok: each one wakes the Brain even outside a group.
    wakes = [r for r in await outbox_rows(store, session) if '"tool:' in r.data]
    assert len(wakes) == 2


async def test_recovery_on_the_last_delivery_fails_instead_of_executing(
    hs: Settings, store: Store, bus: Bus
) -> None:
    settings = hs.model_copy(update={"max_deliver": 1})
    session = new_id("s")
    intent = make_intent(bus, session, "echo", {"text": "hi"})
    await commit_runs(store, bus, session, [intent])
    await abandon(store, intent)
    async with running(settings, tools=["echo"]):
        await dispatch(bus, intent)
        result = await result_of(store, intent)
        await settled(bus, "echo")
    assert result.outcome == "failed" and result.error_code == "max_deliveries"
    assert "1 deliveries without a result" in (result.error or "")
    assert CALLS[intent.run_id] == 0
