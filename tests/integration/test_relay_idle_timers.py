"""An idle relay does not tick: it sleeps until its earliest timer is due, and a Brain's
timer notification (a commit armed a timer) wakes it for timers armed earlier than that."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from baton.bus.bus import Bus
from baton.bus.timer_notify import TimerNotifier
from baton.models import loads
from baton.settings import Settings
from baton.store.store import now_ms
from baton.store.writes import Writes, timer_member
from tests.helpers import eventually
from tests.integration.test_relay import (
    AGENT,
    BRAIN,
    COMPAT,
    collect,
    connected,
    open_session,
    running,
    wake_puller,
)


@pytest.fixture
async def bus(settings: Settings) -> AsyncIterator[Bus]:
    async with await Bus.connect(settings, "test") as bus:
        await bus.ensure_streams()
        yield bus


# Far beyond any wait below: a relay that fires a timer sooner did not wait for a tick.
NEVER_MS = 600_000


def idle_settings(settings: Settings, **more: object) -> Settings:
    return settings.model_copy(update={"progress_deadline_ms": NEVER_MS,
                                       "timer_idle_tick_ms": NEVER_MS, **more})


@asynccontextmanager
async def sleeping_relay(bus: Bus, settings: Settings) -> AsyncIterator[tuple[Any, ...]]:
    """An open session "s1" and a relay idling until its deadline (NEVER_MS ahead), the
    session's submit wake consumed; yields (store, fence, relay, wakes, submit wakes), the
    store set to notify the relays as a Brain's does."""
    wakes = await wake_puller(bus)
    async with connected(settings) as store:
        fence = await open_session(store, bus, "s1")
        async with running(settings) as relay:
            submitted = await collect(wakes, 1)
            await eventually(lambda: relay.timer_wait_s > 60, timeout=20,
                             message="relay idles until its next timer")
            store.timers_armed = TimerNotifier(bus)
            yield store, fence, relay, wakes, submitted


async def test_a_notification_wakes_an_idle_relay_for_a_timer_armed_before_its_head(
    bus: Bus, settings: Settings
) -> None:
    wake = bus.wake_subject(AGENT, COMPAT)
    async with sleeping_relay(bus, idle_settings(settings)) as (store, fence, relay, wakes,
                                                                submitted):
        assert [loads(m.data)["reason"] for m in submitted] == ["submit"]
        member = timer_member("task", "s1", "t1", wake)
        await store.commit("s1", fence, Writes(timers_add={member: now_ms() + 100}), BRAIN)
        fired = await collect(wakes, 1, timeout=20)
    assert loads(fired[0].data)["reason"] == "timer:task"
    assert relay.counts.timers_fired == 1


async def test_a_deadline_armed_while_the_relay_idles_still_wakes_the_session(
    bus: Bus, settings: Settings
) -> None:
    async with sleeping_relay(bus, idle_settings(settings)) as (store, fence, _, wakes, _):
        # A Brain's commit re-arms the progress deadline, much sooner than before.
        await store.commit("s1", fence, Writes(deadline_ms=300), BRAIN)
        fired = await collect(wakes, 1, timeout=20)
    assert loads(fired[0].data)["reason"] == "timer:deadline"


async def test_an_idle_relay_wakes_for_its_earliest_timer_without_ticking(
    bus: Bus, settings: Settings
) -> None:
    settings = idle_settings(settings)
    wake = bus.wake_subject(AGENT, COMPAT)
    wakes = await wake_puller(bus)
    async with connected(settings) as store:
        fence = await open_session(store, bus, "s1")
        member = timer_member("task", "s1", "t1", wake)
        due = now_ms() + 8_000  # past the relay's busy spell after the submit's wake
        await store.commit("s1", fence, Writes(timers_add={member: due}), BRAIN)  # no notification
        async with running(settings) as relay:
            await collect(wakes, 1)  # the submit's wake
            await eventually(lambda: not relay.busy(), timeout=20, message="relay idles")
            fired = await collect(wakes, 1, timeout=30)
            assert now_ms() >= due
    assert loads(fired[0].data)["reason"] == "timer:task"
    assert relay.counts.timers_fired == 1


async def test_without_a_notification_the_idle_look_still_finds_a_new_timer(
    bus: Bus, settings: Settings
) -> None:
    settings = idle_settings(settings, timer_idle_tick_ms=300)
    wake = bus.wake_subject(AGENT, COMPAT)
    wakes = await wake_puller(bus)
    async with connected(settings) as store:
        fence = await open_session(store, bus, "s1")
        async with running(settings) as relay:
            await collect(wakes, 1)
            await eventually(lambda: not relay.busy(), timeout=20, message="relay idles")
            member = timer_member("task", "s1", "t1", wake)  # a lost notification: none at all
            await store.commit("s1", fence, Writes(timers_add={member: now_ms()}), BRAIN)
            fired = await collect(wakes, 1, timeout=20)
    assert loads(fired[0].data)["reason"] == "timer:task"
