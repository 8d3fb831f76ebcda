"""Timers run on one clock, Redis', whatever a Brain's host clock says (baton.store.clock).

A Brain whose host clock is 5 s behind or ahead of Redis runs a task that sleeps 2 s on a
durable timer, against real Redis and NATS servers with a relay and a Hands in this event
loop. The Brain used to compute the due time on its own clock (the relay fires on Redis')
and to re-check "due" on its own clock: 5 s behind, the fired timer was "not due" and the
task waited for its progress deadline (15 s); 5 s ahead, it slept 7 s. Everything here is
measured on Redis' clock (``TIME``), bounded by causal order, not by how long anything took.
"""

from __future__ import annotations

from typing import Any

import pytest

from baton.brain.worker import BrainWorker
from baton.client import Client
from baton.hands.worker import HandsWorker
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.clock import StoreClock, now_ms
from tests.helpers import eventually, running
from tests.task_apps import AGENT, app

SKEW_MS = 5_000
SLEEP_MS = 2_000
# How far the Brain's measure of Redis' clock may be off: half a round trip to Redis (the
# fastest of three), far under the skew; room for a loaded machine.
ERROR_MS = 1_000


async def redis_ms(client: Client) -> int:
    sec, usec = await client.store.redis.time()
    return int(sec) * 1000 + int(usec) // 1000


@pytest.mark.parametrize("skew_ms", [-SKEW_MS, SKEW_MS], ids=["behind", "ahead"])
async def test_a_brain_with_a_skewed_clock_fires_its_timers_on_redis_clock(
        settings: Settings, skew_ms: int) -> None:
    clock = StoreClock(local=lambda: now_ms() + skew_ms)
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app,
                        clock=clock)
    hands = HandsWorker(settings.model_copy(update={"worker_name": "hands-1"}), app)
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    async with running(relay, hands, brain):
        client = await Client.connect(settings)
        try:
            before = await redis_ms(client)
            sid, tid, _ = await client.start_task(None, "sleeper",
                                                  {"seconds": SLEEP_MS / 1000}, agent=AGENT)

            async def sleeping() -> Any:
                t = await client.store.inbox.task(sid, tid)
                return t if t.state.name == "sleeping" else None

            asleep = await eventually(sleeping, timeout=30, message="the task sleeps")
            seen = await redis_ms(client)
            task = await client.wait_task(sid, tid, timeout=60)
        finally:
            await client.close()
    assert abs(clock.offset_ms + skew_ms) <= ERROR_MS  # it measured the skew
    until = asleep.state.until_ms
    # The sleep was committed between `before` and `seen` (Redis' clock): its due time is
    # 2 s after that on Redis' clock, not 3 s before it (behind) or 7 s after (ahead).
    assert before + SLEEP_MS - ERROR_MS <= until <= seen + SLEEP_MS + ERROR_MS, (
        until - before, seen - before)
    assert task.state.name == "terminal" and task.result is not None
    # It woke on its own timer's wake, once due on Redis' clock: not early, and not on the
    # progress deadline (which would be 15 s after the sleep).
    assert until <= task.result["woke_ms"] < until + settings.progress_deadline_ms, (
        task.result["woke_ms"] - until)
