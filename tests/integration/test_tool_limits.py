"""baton.store.limits on real Redis (one server and a cluster): a tool's fleet-wide slots and
rate (tool_limit.lua).

Timing is read from Redis' own clock (the script's, ``TIME``): what must hold is that no
more than the cap hold slots at once, that slots go in arrival order, that a holder or a
waiter that died frees its place once its time passed on that clock, and that admissions
at a rate are spaced by its interval on that clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from baton.errors import ConfigError, ValidationError
from baton.limits import ToolLimit, parse_rate
from baton.settings import Settings
from baton.store.keys import Keys
from baton.store.limits import Limits
from baton.store.redis_client import connect_redis
from tests.conftest import TOPOLOGIES
from tests.helpers import eventually

#: Long enough that no slot or place lapses while a loaded machine runs a test ...
SLOT_MS = 60_000
#: ... but for the test of a dead holder, whose slot must come back in the test's time.
SHORT_SLOT_MS = 400


@pytest.fixture
async def limits(topo_settings: Settings) -> AsyncIterator[Limits]:
    redis = connect_redis(topo_settings)
    try:
        yield Limits(redis, Keys(topo_settings.namespace, topo_settings.shards),
                     slot_ms=SLOT_MS)
    finally:
        await redis.aclose()


async def redis_ms(redis: aioredis.Redis) -> int:
    sec, usec = await redis.time()
    return int(sec) * 1000 + int(usec) // 1000


def test_rates_are_read_as_written() -> None:
    assert parse_rate("20/s") == 20 and parse_rate("600/min") == 10
    assert parse_rate(" 1.5 / h ") == pytest.approx(1.5 / 3600)
    for bad in ("20", "0/s", "-1/s", "1/day", "nan/s"):
        with pytest.raises(ConfigError, match="invalid rate"):
            parse_rate(bad)
    with pytest.raises(ConfigError):
        ToolLimit(max_concurrency=-1)
    assert ToolLimit(3, 20.0).interval_ms == 50 and ToolLimit().interval_ms == 0


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_no_more_than_the_cap_hold_slots_and_they_go_in_arrival_order(
    topology: str, limits: Limits
) -> None:
    cap = ToolLimit(max_concurrency=3)
    holding: set[str] = set()
    most = 0
    order: list[str] = []

    released = asyncio.Condition()  # a release announced, as the Hands announce theirs

    async def run(member: str) -> None:
        nonlocal most
        while not (admission := await limits.acquire("mail", cap, member)).granted:
            async with released:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(released.wait(), admission.retry_ms / 1000)
        holding.add(member)
        order.append(member)
        most = max(most, len(holding))
        assert len(holding) <= 3, holding
        await asyncio.sleep(0)
        holding.discard(member)
        await limits.release("mail", cap, member)
        async with released:
            released.notify_all()

    # Each asks once in a known order first, then all run at once.
    members = [f"run-{i:02d}" for i in range(40)]
    first = [await limits.acquire("mail", cap, m) for m in members]
    assert [a.granted for a in first[:3]] == [True] * 3
    assert [a.position for a in first[3:6]] == [1, 2, 3] and not any(a.granted for a in first[3:])
    for m in members[:3]:
        await limits.release("mail", cap, m)
    # The freed slots go to the three first in line, although they ask last.
    again = {m: (await limits.acquire("mail", cap, m)).granted for m in reversed(members[3:])}
    assert {m for m, granted in again.items() if granted} == set(members[3:6])
    for m in members[3:6]:
        await limits.release("mail", cap, m)
    await asyncio.gather(*(run(m) for m in members[6:]))
    assert 1 <= most <= 3 and sorted(order) == members[6:]
    usage = await limits.look("mail", cap)
    assert (usage.in_use, usage.waiting) == (0, 0)


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_tenants_with_runs_waiting_take_turns_for_the_slots(
    topology: str, limits: Limits
) -> None:
    """Tenant a's twenty runs wait for the one slot; tenant b's two, arriving after them,
    are served after one of a's each, not after all twenty; c (weight 2) gets two turns for
    each of a's. Within a tenant, arrival order."""
    cap = ToolLimit(max_concurrency=1)
    assert (await limits.acquire("mail", cap, "holder", tenant="a")).granted
    for i in range(20):
        assert not (await limits.acquire("mail", cap, f"a-{i:02d}", tenant="a")).granted
    for i in range(2):
        assert not (await limits.acquire("mail", cap, f"b-{i}", tenant="b")).granted
    served = []
    holder = "holder"
    while True:
        await limits.release("mail", cap, holder)
        line = [m for m in [f"a-{i:02d}" for i in range(20)] + ["b-0", "b-1"]
                if m not in served]
        if not line:
            break
        granted = [m for m in line if (await limits.acquire(
            "mail", cap, m, tenant=m[0])).granted]
        assert len(granted) == 1, granted
        holder = granted[0]
        served.append(holder)
    assert served.index("b-0") <= 2 and served.index("b-1") <= 4, served
    assert [m for m in served if m[0] == "a"] == [f"a-{i:02d}" for i in range(20)]
    await limits.release("mail", cap, holder)

    # weights: c's share is half of a's, so c goes twice for each of a's turns
    assert (await limits.acquire("mail", cap, "h2", tenant="a")).granted
    for i in range(6):
        await limits.acquire("mail", cap, f"a2-{i}", tenant="a")
    for i in range(6):
        await limits.acquire("mail", cap, f"c-{i}", tenant="c", weight=2)
    order = []
    holder = "h2"
    for _ in range(12):
        await limits.release("mail", cap, holder)
        waiting = [m for m in [f"a2-{i}" for i in range(6)] + [f"c-{i}" for i in range(6)]
                   if m not in order]
        granted = [m for m in waiting if (await limits.acquire(
            "mail", cap, m, tenant=m[0], weight=2 if m[0] == "c" else 1)).granted]
        assert len(granted) == 1, granted
        holder = granted[0]
        order.append(holder)
    assert [m[0] for m in order[:6]].count("c") >= 3, order


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_a_run_granted_with_nobody_in_line_moves_the_tags_as_the_line_would(
    topology: str, limits: Limits
) -> None:
    """A cap that does not bind grants at once without entering the line, yet its grants
    count as the line's: each moves the virtual time and its tenant's share, so a run that
    then waits gets the start tag it would have got had every grant gone through the line.
    A release with nobody in line names nobody; one with runs waiting names the first."""
    cap = ToolLimit(max_concurrency=2)
    redis = limits.redis
    _, waiting, alive, tickets, _ = limits.keys.tool_limit("mail")
    assert (await limits.acquire("mail", cap, "a-0", tenant="a")).granted
    assert (await limits.acquire("mail", cap, "b-0", tenant="b", weight=2)).granted
    assert not await redis.exists(waiting)  # never entered
    assert await redis.hmget(alive, ["vt:a", "vt:b"]) == ["1000", "500"]
    assert await redis.get(tickets) == "0"
    # The cap binds now: a's next run starts one share of a's after the first.
    assert not (await limits.acquire("mail", cap, "a-1", tenant="a")).granted
    assert await redis.zscore(waiting, "a-1") == 1000
    assert await limits.release("mail", cap, "b-0") == ["a-1"]
    assert (await limits.acquire("mail", cap, "a-1", tenant="a")).granted
    assert await redis.get(tickets) == "1000"
    assert not await redis.exists(waiting)
    assert await limits.release("mail", cap, "a-0") == []
    assert await limits.release("mail", cap, "a-1") == []
    assert await limits.release("mail", cap, "a-1") == []  # again: nothing held, no error
    usage = await limits.look("mail", cap)
    assert (usage.in_use, usage.waiting) == (0, 0)


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_a_dead_holders_slot_and_a_dead_waiters_place_come_back(
    topology: str, limits: Limits
) -> None:
    limits = Limits(limits.redis, limits.keys, slot_ms=SHORT_SLOT_MS)
    cap = ToolLimit(max_concurrency=1)
    assert (await limits.acquire("pay", cap, "holder")).granted
    waiting = await limits.acquire("pay", cap, "dead-waiter")  # then stops asking
    assert not waiting.granted and waiting.position == 1
    assert 0 < waiting.retry_ms <= SHORT_SLOT_MS
    live = await limits.acquire("pay", cap, "live")
    # second in line (or first, on a machine so slow the dead waiter lapsed already)
    assert not live.granted and live.position in (1, 2)
    # The holder dies (renews no more): once its time passed, the next live one in line gets
    # the slot; the dead waiter ahead of it was dropped on the way.
    slots = limits.keys.tool_limit("pay")[0]
    until = int(float(await limits.redis.zscore(slots, "holder")))

    async def granted() -> bool:
        return (await limits.acquire("pay", cap, "live")).granted
    await eventually(granted, timeout=30, interval=0.05, message="the dead holder's slot")
    assert await redis_ms(limits.redis) >= until  # not before its time, on Redis' clock
    assert await limits.redis.zscore(slots, "holder") is None
    assert await limits.redis.zscore(limits.keys.tool_limit("pay")[1], "dead-waiter") is None
    assert not await limits.renew("pay", cap, "holder")  # it learns it lost the slot
    assert await limits.renew("pay", cap, "live")


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_admissions_at_a_rate_are_spaced_by_its_interval_on_redis_clock(
    topology: str, limits: Limits
) -> None:
    rate = ToolLimit(per_second=20.0)  # one every 50 ms
    times: list[int] = []
    for i in range(8):
        while True:
            admission = await limits.acquire("api", rate, f"call-{i}")
            if admission.granted:
                times.append(await redis_ms(limits.redis))
                break
            assert admission.retry_ms <= rate.interval_ms * 8
            await asyncio.sleep(admission.retry_ms / 1000)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Each admission waits for the previous one's interval (the reading of TIME after the
    # grant may come a little later than the grant itself, never earlier).
    assert sum(gaps) >= rate.interval_ms * (len(times) - 2), gaps
    # With a burst, that many go at once.
    burst = ToolLimit(per_second=1.0, burst=3)
    got = [(await limits.acquire("bursty", burst, f"b-{i}")).granted for i in range(4)]
    assert got == [True, True, True, False]


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_bad_input_is_refused_with_nothing_written(topology: str, limits: Limits) -> None:
    with pytest.raises(ValidationError):
        limits.keys.tool_limit("bad tool")
    keys = limits.keys.tool_limit("mail")
    script = limits._script  # the script itself, fed hostile arguments
    for args in (["acquire", "m", "nan", 400, 0, 1], ["acquire", "m", 3, 0, 0, 1],
                 ["acquire", "m", 3, 400, -5, 1], ["acquire", "m", 3, 400, 0, 0],
                 ["acquire", "", 3, 400, 0, 1], ["steal", "m", 3, 400, 0, 1]):
        with pytest.raises(Exception, match="INVALID"):
            await script(keys=keys, args=args)
    assert not any([await limits.redis.exists(k) for k in keys])


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_a_look_counts_slots_and_places_by_tenant(topology: str, limits: Limits) -> None:
    """Members end in their session's tenant (<run>/<hands>/<nonce>/<tenant>, as the Hands
    name them): inspect and the API show a shared tool's slots and line by tenant."""
    from rich.console import Console

    from baton.cli.inspect import _render_tool_limits

    cap = ToolLimit(max_concurrency=1)
    assert (await limits.acquire("mail", cap, "r0/h1/n0/acme", tenant="acme")).granted
    for member in ("r1/h1/n1/acme", "r2/h2/n2/globex", "r3/h2/n3/globex", "r4/h1/n4"):
        assert not (await limits.acquire("mail", cap, member)).granted
    usage = await limits.look("mail", cap)
    assert usage.in_use_by_tenant == {"acme": 1}
    assert usage.waiting_by_tenant == {"acme": 1, "default": 1, "globex": 2}
    console = Console(width=200, record=True)
    _render_tool_limits([{"tool": "mail", "limit": cap.describe(), **cap.as_dict(),
                          **dataclasses.asdict(usage)}], console)
    shown = console.export_text()
    assert "1 of 1 (acme 1)" in shown and "4 (acme 1, default 1, globex 2)" in shown, shown
