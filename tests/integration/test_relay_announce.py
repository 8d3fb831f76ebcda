"""A relay announces itself on its lease loop's wake-ups (an idle relay wakes once for both),
never later than every ``ANNOUNCE_EVERY_S`` however long its lease, once per tick while Redis
is down, and withdraws its announcement when it stops gracefully."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from baton.devkit.servers import RedisServer
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.store import Store
from baton.store.workers import all_services
from tests.helpers import eventually
from tests.integration.test_relay import running, store  # noqa: F401 - fixture


def spy(relay: Relay) -> list[tuple[str, str]]:
    """(event, task name) for each lease tick and announcement from now on."""
    events: list[tuple[str, str]] = []
    leases: Any = relay.leases
    tick, announce = leases.tick, relay.announce_once

    def task_name() -> str:
        task = asyncio.current_task()
        return task.get_name() if task is not None else ""

    async def ticked(now_ms: int) -> None:
        events.append(("tick", task_name()))
        await tick(now_ms)

    async def announced(*args: Any) -> None:
        events.append(("announce", task_name()))
        await announce(*args)

    leases.tick = ticked
    relay.announce_once = announced  # type: ignore[method-assign]
    return events


def since_first_tick(events: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The events from the first tick the spy saw (it may be set between a tick and the
    announcement of the same wake-up)."""
    ticks = [k for k, (e, _) in enumerate(events) if e == "tick"]
    return events[ticks[0]:] if ticks else []


async def test_an_idle_relay_announces_on_its_lease_ticks(settings: Settings) -> None:
    async with running(settings) as relay:
        seen = spy(relay)
        await eventually(lambda: sum(e == "announce" for e, _ in since_first_tick(seen)) >= 2,
                         timeout=30, message="two announcements after a tick")
    events = since_first_tick(seen)
    announcements = [k for k, (e, _) in enumerate(events) if e == "announce"]
    # Each in the lease loop's task, right after a tick of that same wake-up.
    assert {task for _, task in events} == {"relay-leases"}
    assert all(k > 0 and events[k - 1][0] == "tick" for k in announcements)
    # Not at every tick: about every ANNOUNCE_EVERY_S, every second or third tick.
    assert sum(e == "tick" for e, _ in events) > len(announcements)


async def test_a_relay_with_a_long_lease_still_announces_between_its_ticks(
    settings: Settings,
) -> None:
    # Ticks every 10 s (15 s holding every shard): three announcements come first.
    async with running(settings, lease_ms=30_000) as relay:
        events = spy(relay)
        await eventually(lambda: sum(e == "announce" for e, _ in events) >= 2, timeout=60,
                         message="two announcements")
    assert sum(e == "tick" for e, _ in events) < sum(e == "announce" for e, _ in events)


async def test_a_stopped_relay_withdraws_its_announcement(
    settings: Settings, store: Store  # noqa: F811 - the fixture
) -> None:
    async def relays() -> set[str]:
        return {str(s["name"]) for s in await all_services(store.redis, store.keys, 0, "relay")}

    async with running(settings) as relay:
        name = relay.name

        async def announced() -> bool:
            return name in await relays()

        await eventually(announced, timeout=10, message="announced")
    assert name not in await relays()



async def test_with_redis_down_a_relay_tries_its_announcement_once_per_lease_tick(
    settings: Settings, tmp_path: Path
) -> None:
    """Not written (Redis gone): tried again at the next tick, not at once (no spinning)."""
    async with RedisServer(tmp_path / "redis") as redis:
        private = settings.model_copy(update={"redis_url": redis.url, "namespace": "down"})
        async with running(private) as relay:
            events = spy(relay)
            await redis.stop()
            await eventually(lambda: sum(e == "announce" for e, _ in events) >= 3, timeout=60,
                             message="three announcements tried with Redis down")
            assert not relay.redis_reachable
            await redis.start()  # for the relay's graceful stop
    ticks = sum(e == "tick" for e, _ in events)
    assert 1 <= sum(e == "announce" for e, _ in events) <= ticks + 1
