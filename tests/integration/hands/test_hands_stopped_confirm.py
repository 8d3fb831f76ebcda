"""A ``confirm`` tool stopped mid-call, by its deadline or by a cancel, may have acted (the
provider took the mail, its reply never came): its confirm function is asked, and what it
finds is the run's result. The run read "failed (timeout)" or "cancelled" while the mail
had gone out, and a model told so sends it again."""

from __future__ import annotations

import asyncio

from baton.bus.bus import Bus
from baton.settings import Settings
from baton.store.store import Store, now_ms
from tests.helpers import eventually
from tests.integration.hands_app import (
    ACTED,
    CALLS,
    CONFIRM_DOWN,
    CONFIRM_FAILED,
    commit_runs,
    dispatch,
    make_intent,
    new_id,
    result_of,
    running,
    settled,
)


async def test_a_confirm_tool_past_its_deadline_adopts_what_confirm_finds(
    hs: Settings, store: Store, bus: Bus
) -> None:
    session = new_id("s")
    acted = make_intent(bus, session, "slow_send", {"text": "acts"})
    idle = make_intent(bus, session, "slow_send", {"text": "stalls before acting"})
    await commit_runs(store, bus, session, [acted, idle])
    async with running(hs, tools=["slow_send"]):
        for intent in (acted, idle):
            await dispatch(bus, intent)
        found, missing = await result_of(store, acted), await result_of(store, idle)
        await settled(bus, "slow_send")
    assert (found.outcome, found.recovery, found.output) == (
        "ok", "confirmed", {"sent": acted.operation_id})
    assert (missing.outcome, missing.error_code) == ("error", "timeout")
    assert CALLS[acted.run_id] == CALLS[idle.run_id] == 1  # asked, never run again


async def test_a_confirm_tool_cancelled_mid_call_adopts_what_confirm_finds(
    hs: Settings, store: Store, bus: Bus
) -> None:
    session = new_id("s")
    intent = make_intent(bus, session, "held_send", {"text": "acts"})  # deadline: 60 s
    await commit_runs(store, bus, session, [intent])
    hs = hs.model_copy(update={"attempt_ttl_ms": 300})  # heartbeats (and cancels) come fast
    async with running(hs, tools=["held_send"]):
        await dispatch(bus, intent)
        await eventually(lambda: ACTED.get(intent.operation_id), timeout=10)
        # the Brain's cancel mark on the live run, as its commit writes it
        await store.redis.hset(store.keys.session(session).intents,
                               f"{intent.run_id}.cancel", now_ms())
        result = await asyncio.wait_for(result_of(store, intent), 20)
        await settled(bus, "held_send")
    assert (result.outcome, result.recovery, result.output) == (
        "ok", "confirmed", {"sent": intent.operation_id})


async def test_a_stopped_confirm_tool_whose_confirm_cannot_tell_is_decided_later(
    hs: Settings, store: Store, bus: Bus
) -> None:
    """The provider down past the deadline: confirm fails too, and the run read 'failed
    (timeout)' (or 'cancelled') while the mail had gone out. It is left unfinished and a
    later delivery confirms first, once the provider answers."""
    session = new_id("s")
    timed_out = make_intent(bus, session, "slow_send", {"text": "acts"})
    cancelled = make_intent(bus, session, "held_send", {"text": "acts"})
    await commit_runs(store, bus, session, [timed_out, cancelled])
    down = {timed_out.operation_id, cancelled.operation_id}
    CONFIRM_DOWN.update(down)
    hs = hs.model_copy(update={"attempt_ttl_ms": 300})
    try:
        async with running(hs, tools=["slow_send", "held_send"]):
            for intent in (timed_out, cancelled):
                await dispatch(bus, intent)
            await eventually(lambda: ACTED.get(cancelled.operation_id), timeout=10)
            await store.redis.hset(store.keys.session(session).intents,
                                   f"{cancelled.run_id}.cancel", now_ms())
            # both stopped, and confirm failed for both: no result was recorded
            await eventually(lambda: all(CONFIRM_FAILED[o] for o in down), timeout=20)
            for intent in (timed_out, cancelled):
                run = await store.runs.get(session, intent.run_id)
                assert run is not None and run.result is None, run
            CONFIRM_DOWN.difference_update(down)  # the provider answers again
            results = [await asyncio.wait_for(result_of(store, i), 30)
                       for i in (timed_out, cancelled)]
            await settled(bus, "slow_send", "held_send")
    finally:
        CONFIRM_DOWN.difference_update(down)
    for intent, result in zip((timed_out, cancelled), results, strict=True):
        assert (result.outcome, result.recovery, result.output) == (
            "ok", "confirmed", {"sent": intent.operation_id}), result
        assert CALLS[intent.run_id] == 1  # never sent again
