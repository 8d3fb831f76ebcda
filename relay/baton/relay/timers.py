"""A relay's timers: the due timers of the shards it holds become wakes, and their inboxes
are swept for requests no Brain took up.

:class:`TimerLoop` is one of the loops of a :class:`~baton.relay.worker.Relay`. Due timers
(sleeping tasks, progress deadlines) become wake rows by ``fire_timers.lua``, fenced by the
shard's lease; the relay's read loop sends them on. While rows move (and for a few seconds
after, :meth:`TimerLoop.wake`) the timer heads are read every ``timer_tick_ms``; an idle
relay sleeps until its earliest timer is due, woken earlier by moved rows, a change of its
shards or a Brain's timer notification (a commit armed a timer,
:mod:`baton.bus.timer_notify`), and looks at least every ``timer_idle_tick_ms`` in case a
notification was lost.

The same loop sweeps the held shards' inboxes: a client's request arms no timer, so a
session whose inbox holds requests no Brain took up gets its progress deadline armed
(``arm_requests.lua``), which wakes it if they still wait then (their wake was lost). Every
``relay_sweep_ms`` it looks at the sessions whose request wakes were published since the
last sweep (the shard's ``requested`` set, written with the relay's acks: see
``Outbox.requests``), so its cost follows the requests, not the sessions the store keeps.
For a shard just taken, and every ``relay_scan_ms``, it scans the keyspace for every inbox
(a request whose wake row was deleted before a relay read it, or whose index entry a
failover lost, is in no index).
"""

from __future__ import annotations

import asyncio
import time

from redis.exceptions import NoPermissionError

from baton.observability.log import bounded, error_text, get_logger
from baton.service import wait_either
from baton.settings import Settings
from baton.store.outbox import Outbox

from .failures import REDIS_DOWN, Backoff, reraise_cancel
from .leases import ShardLeases
from .publisher import Counts

__all__ = ["ACTIVE_S", "TimerLoop"]

log = get_logger("baton.relay")

# After moving rows (or a timer notification), the timer loop looks at the timer heads every
# timer_tick_ms for this long; idle past it, it sleeps until the earliest head is due (at
# most timer_idle_tick_ms). Longer than a Brain's notification interval
# (baton.bus.timer_notify), so the timers a Brain arms between two of its notifications are
# seen by the fast looks.
ACTIVE_S = 5.0


class TimerLoop:
    """Fires the due timers of the shards a relay holds and sweeps their inboxes.

    ``counts`` are the relay's counters (``timers_fired``), ``stopping`` ends :meth:`run`;
    :meth:`run` gets the relay's shard leases (the shards held, their fences; a refused
    firing gives the shard up).
    """

    def __init__(self, settings: Settings, name: str, counts: Counts,
                 stopping: asyncio.Event) -> None:
        self.settings = settings
        self.name = name
        self.counts = counts
        self.stopping = stopping
        self.wait_s = 0.0  # how long the current wait may last
        self._woken = asyncio.Event()  # look at the timer heads now
        self._active_until = 0.0  # monotonic time until which the timers tick fast
        self._swept: set[int] = set()  # the shards of the last inbox sweep, and when
        self._swept_at = 0.0
        self._scanned_at = time.monotonic()  # the last scan of the keyspace (shards taken)

    def wake(self) -> None:
        """Rows moved or a Brain notified: tick fast for a while, at once if idle until now."""
        now = time.monotonic()
        if now >= self._active_until:
            self._woken.set()
        self._active_until = now + ACTIVE_S

    def look_now(self) -> None:
        """Look at the heads (and sweep) at once: the relay took shards."""
        self._woken.set()

    @property
    def swept(self) -> frozenset[int]:
        """The shards the last inbox sweep covered (a shard new to this relay is scanned
        when it is first swept)."""
        return frozenset(self._swept)

    def busy(self) -> bool:
        """Rows moved (or a timer notification came) within the last :data:`ACTIVE_S` seconds."""
        return time.monotonic() < self._active_until

    async def run(self, box: Outbox, leases: ShardLeases) -> None:
        s = self.settings
        backoff = Backoff()
        while not self.stopping.is_set():
            delay = (s.timer_tick_ms if self.busy()
                     else max(s.timer_tick_ms, s.timer_idle_tick_ms)) / 1000
            self._woken.clear()
            try:
                held = dict(leases.held)
                await self._sweep(box, leases, held)
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
                log.warning("timers_failed", error=error_text(exc), delay_s=delay)
            self.wait_s = delay
            if await wait_either(self.stopping, self._woken, delay):
                return

    async def _sweep(self, box: Outbox, leases: ShardLeases, held: dict[int, int]) -> None:
        """Wake the sessions of ``held`` whose inbox holds requests: when the last sweep is
        ``relay_sweep_ms`` old (or a shard is new), those of the ``requested`` sets, and those
        a scan of the keyspace finds, for the shards new to this relay or, once the last
        scan is ``relay_scan_ms`` old, for all of them."""
        s = self.settings
        now = time.monotonic()
        new = sorted(held.keys() - self._swept)
        if not held or (not new and now - self._swept_at < s.relay_sweep_ms / 1000):
            return
        scan_all = now - self._scanned_at >= s.relay_scan_ms / 1000
        if scan_all:
            new = sorted(held)
        batch = s.relay_batch
        armed = 0
        try:
            found: dict[int, list[str]] = {}
            if new:
                try:
                    found = await box.waiting_requests(new)
                except NoPermissionError as exc:  # an ACL without SCAN: the index still counts
                    log.error("inbox_sweep_failed", error=bounded(exc))
            for shard, sessions in (await box.requested(sorted(held), 100 * batch)).items():
                found[shard] = list(dict.fromkeys([*found.get(shard, []), *sessions]))
            for shard, sessions in found.items():
                for i in range(0, len(sessions), batch):
                    n = await box.arm_requests(shard, sessions[i:i + batch], self.name,
                                               held[shard], s.progress_deadline_ms)
                    if n < 0:
                        leases.lost(shard)
                        break
                    armed += n
        except NoPermissionError as exc:  # an ACL without the requested set: timers still fire
            log.error("inbox_sweep_failed", error=bounded(exc))
        self._swept, self._swept_at = set(held), now  # not after Redis was unreachable
        if scan_all:
            self._scanned_at = now
        if armed:
            log.info("waiting_requests_woken", sessions=armed)
