"""How a client reads a session's committed state, and waits on it.

A read tells a lost store from a missing session (the store's epoch), a corrupt session
from a quarantined one, an archived session from a missing one (a read that finds nothing in
Redis falls through to the archive: :mod:`baton.store.archived`), and waits out Redis away
for a while (a restart, a failover). A wait re-reads on each settled notification of the
session (:mod:`baton.store.settled`), or every second, until what it waits for holds or its
deadline passes; then it says in words what the session most likely waits for.

The re-read every second is a fallback, never the way a wait usually ends: a wait on an
announced settlement (:meth:`~baton.client.Client.wait`) that found its work done by that
re-read, without having heard the notification, is counted
(``baton.client.wait.fallbacks``, and :attr:`SessionReads.fallbacks`) and logged as a
warning once per process (``settled_notification_missed``), so notifications that stop
being heard (a library upgrade, a proxy that drops pub/sub) show in the first minute of use
instead of as waits that each take a second.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.exceptions as rex

from baton.errors import (
    CorruptStateError,
    NotFoundError,
    UnavailableError,
    ValidationError,
    WaitTimeout,
    from_redis_error,
)
from baton.observability.log import error_text, get_logger
from baton.settings import Settings
from baton.store import quarantine
from baton.store.archived import ArchivedReads, SessionSource
from baton.store.epoch import StoreEpoch
from baton.store.settled import SettledChannels
from baton.store.store import Store

__all__ = ["SessionReads"]

# redis-py's errors for a server that does not answer (a read is retried past them).
# ClusterDownError / TryAgainError: a Redis Cluster mid-failover (a slot without a primary
# for a moment) answers reads that way; like a restart, it is waited out. So is ClusterError
# ("TTL exhausted"): redis-py's redirects and TRYAGAIN retries used up while a slot migrates
# (a session's keys on two nodes until the slot has moved).
UNREACHABLE: tuple[type[Exception], ...] = (UnavailableError, rex.ConnectionError,
                                           rex.TimeoutError, rex.ClusterDownError,
                                           rex.TryAgainError, rex.ClusterError, OSError)

log = get_logger("baton.client")
T = TypeVar("T")

#: Whether this process has warned of a missed settled notification (once per process).
_missed_warned = False


#: How long a wait that found its work done by the fallback re-read gives the notification
#: to arrive before counting it missed: the settling commit may have landed during that
#: read, its notification on its way to the listener.
_IN_FLIGHT_S = 0.25


async def _heard_soon(signal: asyncio.Future[Any]) -> bool:
    """Whether the notification arrives within :data:`_IN_FLIGHT_S` (at once if it did)."""
    if not signal.done():
        await asyncio.wait({signal}, timeout=_IN_FLIGHT_S)
    return signal.done()


def _missed_notification(session_id: str, count: int) -> None:
    """Count a wait that ended by its fallback re-read; warn the first time in a process."""
    global _missed_warned
    from baton.observability.telemetry import instruments  # the OTel API only when recording

    inst = instruments()
    if inst is not None:
        inst.wait_fallbacks.add(1)
    if not _missed_warned:
        _missed_warned = True
        log.warning(
            "settled_notification_missed", session_id=session_id, fallbacks=count,
            note="a wait found its submission settled by its once-a-second re-read without "
                 "hearing the settled notification: waits take up to a second longer than "
                 "they should. Is the client's Redis connection able to SSUBSCRIBE (pub/sub "
                 "through a proxy, a redis-py version Baton was not tested with)? Counted in "
                 "baton.client.wait.fallbacks; warned once per process")


class SessionReads:
    """A client's checked reads and waits; one per client, sharing its store."""

    def __init__(self, store: Store, settings: Settings, settled: SettledChannels,
                 archived: ArchivedReads) -> None:
        self.store = store
        self.settings = settings
        self.settled = settled  # what the waits listen to
        self.archived = archived  # where a read that finds nothing in Redis looks next
        # Set once connected: a "not found" is checked against it, so a store that lost its
        # state raises StoreEpochError instead.
        self.epoch: StoreEpoch | None = None
        #: Waits on an announced settlement that ended by the fallback re-read (see module).
        self.fallbacks = 0

    async def until(
        self, session_id: str, read: Callable[[SessionSource], Awaitable[T]],
        done: Callable[[T], bool],
        timeout: float,  # noqa: ASYNC109
        *, why: Callable[[str], Awaitable[str]],
        notice: Callable[[Any], T | None] | None = None, what: str = "the work has not ended",
        announced: bool = False,
    ) -> T:
        """Re-read on each settled notification of the session (or every second) until done.

        ``notice`` reads a notification's message: what it returns, when ``done`` holds for
        it, is the answer without a read (see :mod:`baton.store.notices`). ``why`` says, for
        a wait that timed out, what the session most likely waits for. ``announced``: the
        settlement waited for is always notified, so finding it done by the fallback re-read
        means a notification was missed (counted and warned of, see the module).

        A quarantined session never settles: that is checked when a second passed without a
        notification (and by a read that fails to decode), not before every wait, which would
        cost each waiter one more round trip."""
        channel = self.store.keys.settled_channel(session_id)
        unreachable: list[BaseException] = []  # the last read's error while Redis is away
        signal = await self.settled.join(channel)
        fell_back = False  # the last read was the once-a-second fallback's
        try:
            async with asyncio.timeout(timeout):
                while True:
                    # Redis away for a while (a restart, a failover) is waited out to the
                    # wait's own deadline: the work goes on meanwhile
                    current = await self.checked(read, session_id, patience=timeout,
                                                 unreachable=unreachable)
                    if done(current):
                        if fell_back and announced and not await _heard_soon(signal):
                            self.fallbacks += 1
                            _missed_notification(session_id, self.fallbacks)
                        return current
                    # Wake on a notification, or re-check at least every second.
                    await asyncio.wait({signal}, timeout=1.0)
                    fell_back = not signal.done()
                    if signal.done():
                        message = signal.result()
                        signal = self.settled.again(channel, signal)
                        heard = notice(message) if notice is not None else None
                        if heard is not None and done(heard):
                            return heard
                    else:
                        # Redis unreachable here (a restart, a failover) is the next read's
                        # to wait out, and then to tell a lost state from a live one.
                        with contextlib.suppress(*UNREACHABLE):
                            await quarantine.raise_if_quarantined(self.store, session_id)
        except TimeoutError:  # the wait's own deadline (asyncio.timeout's), nothing else's
            reason = (f"Redis unreachable: {error_text(unreachable[0])}" if unreachable
                      else await why(session_id))
            raise WaitTimeout(
                f"{what} in session {session_id} within {timeout:g} s; it goes on ({reason}): "
                f"follow it with `baton watch {session_id}`, look at it with `baton inspect "
                f"{session_id}`", session_id=session_id, why=reason) from None
        finally:
            await self.settled.leave(channel, signal)

    async def checked(self, read: Callable[[SessionSource], Awaitable[T]], session_id: str,
                      *, patience: float | None = None,
                      unreachable: list[BaseException] | None = None) -> T:
        """``read(source)`` of the session, on Redis. When it raises NotFoundError the
        session is looked for once more (:meth:`ArchivedReads.locate`): an archived session
        is read from the archive, one restored meanwhile from Redis again; when it is nowhere,
        that NotFoundError becomes StoreEpochError if the store lost its state. A failure to
        decode the session becomes QuarantinedError once it is quarantined.

        Redis unreachable (restarting, a failover) is waited out for up to ``patience``
        seconds (``client_connect_wait_s`` by default; a wait passes its own deadline, and
        ``unreachable`` gets the last error while it lasts): once it answers, the read says
        whether the state is still there, or the epoch that it was lost.
        """
        loop = asyncio.get_running_loop()
        since: float | None = None
        limit = self.settings.client_connect_wait_s if patience is None else patience
        source: SessionSource | None = SessionSource(self.store)
        missing: NotFoundError | None = None  # what the read on Redis did not find
        while True:
            try:
                if source is None:  # the read on Redis found nothing: where is it?
                    source = await self.archived.locate(session_id)
                    if not source.found and missing is not None:
                        raise missing
                value = await read(source)
                if unreachable:
                    unreachable.clear()
                return value
            except (CorruptStateError, ValidationError):
                await quarantine.raise_if_quarantined(self.store, session_id)
                raise
            except NotFoundError as exc:
                if missing is None:  # once: archived, or in Redis again (restored meanwhile)
                    missing, source = exc, None
                    continue
                if self.epoch is not None:
                    await self.epoch.verify()
                raise
            except UNREACHABLE as exc:
                since = since if since is not None else loop.time()
                if unreachable is not None:
                    unreachable[:] = [exc]
                if loop.time() - since >= limit:
                    raise from_redis_error(exc, session_id=session_id) from exc
                log.debug("wait_read_retry", error=str(exc))
                await asyncio.sleep(0.2)  # a backoff between reads while Redis is away
