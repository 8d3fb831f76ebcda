"""The relay's timer loop (:class:`TimerLoop`, the half of :class:`~baton.relay.worker.Relay`
that fires timers): due timers of the held shards become wake rows (``fire_timers.lua``,
fenced by the shard's lease), which the read loop sends on. While rows move (and for a few
seconds after) the timer heads are read every ``timer_tick_ms``; an idle relay sleeps until
its earliest timer is due, woken earlier by moved rows, a change of its shards or a Brain's
nudge, and looks at least every ``timer_idle_tick_ms``. The same loop sweeps the held
shards' inboxes (:meth:`TimerLoop._sweep`): a session whose inbox holds requests no Brain
took up gets its progress deadline armed (``arm_requests.lua``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from redis.exceptions import NoPermissionError

from baton.observability.log import bounded, get_logger
from baton.settings import Settings
from baton.store.outbox import Outbox

from .failures import REDIS_DOWN, Backoff, reraise_cancel
from .leases import ShardLeases
from .publisher import Counts

__all__ = ["TimerLoop"]

log = get_logger("baton.relay")


class TimerLoop:
    """Fires the held shards' due timers and sweeps their inboxes; what it needs of the
    relay is declared here. Its waits (:meth:`_wait_woken`, :meth:`_first`) serve the
    relay's read and claim loops as well."""

    settings: Settings
    name: str
    leases: ShardLeases | None
    stopping: asyncio.Event
    counts: Counts
    timer_wait_s: float  # how long the timer loop's current wait may last
    _active_until: float  # monotonic time until which the timers tick fast
    _woken: asyncio.Event  # rows moved after an idle spell: look at timers now
    _swept: set[int]  # the shards of the last inbox sweep, and when
    _swept_at: float

    async def _wait_woken(self, event: asyncio.Event, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait up to ``timeout`` s for ``event`` or shutdown; True if shutting down."""
        reraise_cancel()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._first(self.stopping, event)
        return self.stopping.is_set()

    @staticmethod
    async def _first(*events: asyncio.Event) -> None:
        waits = [asyncio.create_task(e.wait()) for e in events]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _timer_loop(self, box: Outbox) -> None:
        s = self.settings
        assert self.leases is not None
        leases = self.leases
        backoff = Backoff()
        while not self.stopping.is_set():
            busy = time.monotonic() < self._active_until
            delay = (s.timer_tick_ms if busy else max(s.timer_tick_ms, s.timer_idle_tick_ms)
                     ) / 1000
            self._woken.clear()
            try:
                held = dict(leases.held)
                await self._sweep(box, held)
                now, heads = await box.timer_heads(sorted(held))
                fired = 0
                for shard, due in heads.items():
                    if due <= now:
                        n = await box.fire_timers(shard, limit=s.relay_batch,
                                                  rearm_ms=s.progress_deadline_ms,
                                                  holder=self.name, fence=held[shard])
                        if n < 0:
                            leases.lost(shard)
                        else:
                            fired += n
                if fired:
                    self.counts.timers_fired += fired
                    log.debug("timers_fired", timers=fired)
                    continue  # look again at once: more may be due in the shards just fired
                later = [due - now for due in heads.values() if due > now]
                if later:
                    delay = min(delay, max(min(later), 1) / 1000)
                backoff.reset()
            except REDIS_DOWN as exc:
                reraise_cancel()
                delay = backoff.next()
                log.warning("timers_failed", error=repr(exc), delay_s=delay)
            self.timer_wait_s = delay
            if await self._wait_woken(self._woken, delay):
                return

    async def _sweep(self, box: Outbox, held: dict[int, int]) -> None:
        """Wake the sessions of ``held`` whose inbox holds requests, when a shard is new
        to this relay or the last sweep is ``relay_sweep_ms`` old."""
        now = time.monotonic()
        if not held or (held.keys() <= self._swept
                        and now - self._swept_at < self.settings.relay_sweep_ms / 1000):
            return
        armed = 0
        try:
            waiting = await box.waiting_requests(sorted(held))
            for shard, sessions in waiting.items():
                for i in range(0, len(sessions), self.settings.relay_batch):
                    n = await box.arm_requests(
                        shard, sessions[i:i + self.settings.relay_batch], self.name,
                        held[shard], self.settings.progress_deadline_ms)
                    if n < 0:
                        assert self.leases is not None
                        self.leases.lost(shard)
                        break
                    armed += n
        except NoPermissionError as exc:  # an ACL without SCAN: the timers still fire
            log.error("inbox_sweep_failed", error=bounded(exc))
        self._swept, self._swept_at = set(held), now  # not after Redis was unreachable
        if armed:
            log.info("waiting_requests_woken", sessions=armed)
