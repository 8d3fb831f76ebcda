"""Tell the relays that a commit armed a timer, so an idle relay need not poll for it.

An idle relay waits for its shards' earliest timer (or a timer notification) instead of
looking at the timer heads every tick; it cannot see a timer armed earlier than that head. A
Brain whose commit arms a timer or a progress deadline publishes an empty core NATS message
on :attr:`~baton.bus.subjects.BusNames.timers_subject` (no stream, fire and forget, a few
microseconds), at most once per :data:`NOTIFY_EVERY_S`: a notified relay looks at the heads
at once and then every ``timer_tick_ms`` for longer than that (``baton.relay.worker``), so
the commits in between are seen too. A lost notification (NATS reconnecting) costs lateness
up to the relay's ``timer_idle_tick_ms``, never a lost timer: the timer is in Redis.
"""

from __future__ import annotations

import time

import nats.errors

from baton.bus.bus import Bus
from baton.observability.log import error_text, get_logger

__all__ = ["NOTIFY_EVERY_S", "TimerNotifier"]

log = get_logger(__name__)

#: At most one timer notification per Brain this often; shorter than the relay's busy spell
#: after one.
NOTIFY_EVERY_S = 1.0


class TimerNotifier:
    """Awaitable hook for :attr:`baton.store.store.Store.timers_armed`."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._subject = bus.names.timers_subject
        self._next = 0.0

    async def __call__(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + NOTIFY_EVERY_S
        try:
            await self._bus.nc.publish(self._subject, b"")
        except nats.errors.Error as exc:  # disconnected: the relay's fallback look covers it
            self._next = 0.0
            # the event keeps its first name: log queries may name it
            log.debug("timer_nudge_failed", error=error_text(exc))
