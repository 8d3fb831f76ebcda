"""Pulling from a durable JetStream consumer.

Owns :class:`Puller` (one fetch loop's pull subscription, made by
:meth:`~baton.bus.bus.Bus.pull`), the fast path that hands over a message already queued
without a loop turn per message, and :class:`_Reconnects`, the event that ends a long poll
when the connection was re-established under it.
"""

from __future__ import annotations

import asyncio
import contextlib

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from baton.bus.nats_auth import _Guard

__all__ = ["Puller"]


def _take_queued_at_once(sub: Subscription) -> None:
    """Let ``sub.next_msg`` return a message already queued without waiting for it.

    nats-py's fetch takes the messages of a batch one ``next_msg`` at a time, and each runs
    in two tasks of its own (its timed get, and asyncio.wait_for's on Python 3.11), a loop
    turn or more per message even when the whole batch arrived in one read. A message in
    the queue is taken as nats-py's own ``next_msg`` takes it (its size off the pending
    count, marked done); an empty queue waits the library's way.
    """
    waiting = sub.next_msg

    async def next_msg(timeout: float | None = 1.0) -> Msg:  # noqa: ASYNC109
        queue = sub._pending_queue
        if queue.empty() or sub._conn.is_closed:
            return await waiting(timeout)
        msg = queue.get_nowait()
        sub._pending_size -= len(msg.data)
        queue.task_done()
        return msg

    sub.next_msg = next_msg  # type: ignore[method-assign]


class _Reconnects:
    """An event set at every reconnect: the pull requests the server held for the old
    connection are gone with it, so a long poll waiting on one must ask again at once."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def fire(self) -> None:
        event, self.event = self.event, asyncio.Event()
        event.set()


class Puller:
    """A pull subscription bound to one durable consumer.

    Each concurrent fetch loop needs its own Puller: fetches on one subscription share an
    inbox and would take each other's messages. ``guard`` and ``reconnects`` are those of
    the connection the subscription is on.
    """

    def __init__(
        self, sub: JetStreamContext.PullSubscription, guard: _Guard | None = None,
        next_subject: str = "", reconnects: _Reconnects | None = None,
    ) -> None:
        self._sub = sub
        self._guard = guard
        self._next = next_subject
        self._reconnects = reconnects
        _take_queued_at_once(sub._sub)

    async def fetch(self, batch: int, timeout: float,  # noqa: ASYNC109
                    stop: asyncio.Event | None = None) -> list[Msg]:
        """Up to ``batch`` messages; waits up to ``timeout`` s for the first; [] if none.

        With ``stop``, the wait also ends (with []) as soon as it is set, so an idle loop can
        long-poll (a pull request every ``timeout``) and still stop at once; a message the
        server sends after that comes back after the consumer's ack_wait. It also ends when
        the connection was re-established meanwhile (the server dropped the pull request
        with the old connection), so a long poll never outlasts a NATS restart.
        Raises :class:`ForbiddenError` when this user may not pull from the consumer.
        """
        if stop is None:
            return await self._fetch(batch, timeout)
        if stop.is_set():
            return []
        ends = [stop] if self._reconnects is None else [stop, self._reconnects.event]
        fetching = asyncio.ensure_future(self._fetch(batch, timeout))
        ended = [asyncio.ensure_future(event.wait()) for event in ends]
        try:
            await asyncio.wait({fetching, *ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in ended:
                waiter.cancel()
            if not fetching.done():
                fetching.cancel()
                with contextlib.suppress(BaseException):
                    await fetching
        return fetching.result() if not fetching.cancelled() else []

    async def _fetch(self, batch: int, timeout: float) -> list[Msg]:  # noqa: ASYNC109
        try:
            if self._guard is None:
                return await self._sub.fetch(batch, timeout=timeout)
            return await self._guard(
                "pull from", self._next, self._sub.fetch(batch, timeout=timeout)
            )
        except TimeoutError:  # nats.errors.TimeoutError, FetchTimeoutError: nothing came
            return []

    async def close(self) -> None:
        with contextlib.suppress(nats.errors.Error):
            await self._sub.unsubscribe()
