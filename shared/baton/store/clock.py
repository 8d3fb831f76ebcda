"""The store's clock: wall time in epoch milliseconds, the unit of every record's times.

Timers are due on **one clock, Redis'**: the relay fires them when Redis' ``TIME`` passes
their due time (fire_timers.lua), and every script stamps its receipts and deadlines with
it. A Brain that computed a due time, or decided that a fired timer is due, on its own host's
clock would disagree with the relay by that host's skew: a Brain 5 s behind Redis found every
fired timer "not due" and left the task to its progress deadline (15 s for a 2 s sleep), one
5 s ahead slept 7 s. :class:`StoreClock` is Redis' clock as a worker reads it: its own clock
plus the offset it last measured against ``TIME`` (the best of three round trips, so the
error is at most half the fastest one), measured again every :data:`RESYNC_S` seconds (a
failover moves ``TIME`` to another host; a host's clock is stepped by NTP). The Brain's task
logic reads it (``TaskContext.now``); :func:`now_ms` remains the host's clock for what is
only shown (a log line, a client's request time).

Redis nodes are assumed to agree with each other (NTP); the offset is measured against one
of them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from baton.observability.log import get_logger

__all__ = ["RESYNC_S", "StoreClock", "now_ms"]

log = get_logger("baton.store.clock")

#: How often a worker measures its offset to Redis' clock again.
RESYNC_S = 30.0
#: Round trips per measurement; the fastest one's offset is kept.
SAMPLES = 3


def now_ms() -> int:
    """Now on this host's clock, in milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


async def _redis_time(redis: Any) -> tuple[int, int]:
    from baton.store.redis_client import is_cluster

    if is_cluster(redis):  # TIME has no key: any node answers
        sec, usec = await redis.time(target_nodes=redis.get_random_node())
    else:
        sec, usec = await redis.time()
    return int(sec), int(usec)


class StoreClock:
    """Redis' clock in milliseconds: ``local()`` plus the offset last measured.

    ``local``: this host's clock (injectable: a test runs a Brain whose clock is skewed).
    Until the first :meth:`sync` the offset is 0.
    """

    def __init__(self, local: Callable[[], int] = now_ms) -> None:
        self.local = local
        self.offset_ms = 0
        #: Half the round trip of the kept measurement: how far off the offset may be.
        self.error_ms: float | None = None

    def now(self) -> int:
        """Now on Redis' clock, as well as this worker knows it."""
        return self.local() + self.offset_ms

    async def sync(self, redis: Any) -> int:
        """Measure the offset to Redis' ``TIME`` again; returns it (ms). Redis errors are
        Baton's (``UnavailableError`` while it is down)."""
        from baton.errors import from_redis_error
        from baton.store.redis_client import REDIS_ERRORS

        best: tuple[int, int] | None = None  # (round trip, offset)
        for _ in range(SAMPLES):
            before = self.local()
            try:
                sec, usec = await _redis_time(redis)
            except REDIS_ERRORS as exc:
                raise from_redis_error(exc) from None
            after = self.local()
            server = sec * 1000 + usec // 1000
            sample = (after - before, server - (before + after) // 2)
            if best is None or sample[0] < best[0]:
                best = sample
        assert best is not None
        if abs(best[1] - self.offset_ms) >= 1000 or self.error_ms is None:
            log.info("clock_offset", offset_ms=best[1], round_trip_ms=best[0])
        self.offset_ms, self.error_ms = best[1], best[0] / 2
        return self.offset_ms

    async def keep(self, redis: Any, stopping: asyncio.Event,
                   every_s: float = RESYNC_S) -> None:
        """Measure again every ``every_s`` until ``stopping``; a failed measurement keeps the
        last offset (logged) and is tried again at the next interval."""
        from baton.errors import BatonError

        while not stopping.is_set():
            try:  # asyncio.timeout: wait_for may swallow a cancellation on Python 3.11
                async with asyncio.timeout(every_s):
                    await stopping.wait()
                return
            except TimeoutError:
                pass
            try:
                await self.sync(redis)
            except BatonError as exc:
                log.warning("clock_sync_failed", error=str(exc)[:200],
                            offset_ms=self.offset_ms)
