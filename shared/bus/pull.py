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
import nats.js.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from baton.bus.nats_auth import _Guard

__all__ = ["Puller"]

_HEARTBEAT = "100"
#: What ends a pull request: no messages (404), expired (408), a conflict (409: the consumer
#: changed, too many waiting requests, a leadership change).
_REQUEST_ENDED = frozenset({"404", "408", "409"})


def _ends_request(status: str, msg: Msg) -> bool:
    """Whether ``status`` (of the status message ``msg``) ends the pull request it answers;
    raises for a status that is an error (nats-py's error for it)."""
    if status in _REQUEST_ENDED:
        return True
    if status == _HEARTBEAT:
        return False
    raise nats.js.errors.APIError.from_msg(msg)


def _take(sub: Subscription) -> Msg:
    """A message already queued on ``sub``, taken as nats-py's own ``next_msg`` takes it
    (its size off the pending count, marked done)."""
    queue = sub._pending_queue
    msg = queue.get_nowait()
    sub._pending_size -= len(msg.data)
    queue.task_done()
    return msg


def _take_queued_at_once(sub: Subscription) -> None:
    """Let ``sub.next_msg`` return a message already queued without waiting for it.

    nats-py's fetch takes the messages of a batch one ``next_msg`` at a time, and each runs
    in two tasks of its own (its timed get, and asyncio.wait_for's on Python 3.11), a loop
    turn or more per message even when the whole batch arrived in one read. A message in
    the queue is taken at once (:func:`_take`); an empty queue waits the library's way.
    """
    waiting = sub.next_msg

    async def next_msg(timeout: float | None = 1.0) -> Msg:  # noqa: ASYNC109
        if sub._pending_queue.empty() or sub._conn.is_closed:
            return await waiting(timeout)
        return _take(sub)

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
                return await self._pull(batch, timeout)
            return await self._guard("pull from", self._next, self._pull(batch, timeout))
        except TimeoutError:  # nats.errors.TimeoutError: nothing came
            return []

    async def _pull(self, batch: int, timeout: float) -> list[Msg]:  # noqa: ASYNC109
        """Up to ``batch`` messages, returned as soon as there are any.

        nats-py's ``fetch`` could, once its long poll had brought a first message, wait for
        the whole batch or the end of the timeout (when a status left by an earlier request
        answered its first one, it sent a second request that lingers for the whole
        batch): a wake sat in a Brain for seconds, past the consumer's ack_wait, came back
        to another Brain as a redelivery, and its session stalled until the duplicates were
        sorted out. Here:

        1. messages already delivered to the subscription are taken first, at once;
        2. else one request for up to ``batch`` that waits for the first message and then
           takes what the stream holds (``no_wait`` with ``expires``: the server answers
           when something comes, with the messages there are and a 404 when fewer), so the
           tool calls of one turn, published together, come in one fetch;
        3. if a 404 or 408 answers that before any message (one left by an earlier
           request, or a server that does not wait), a request for one message waits
           instead, and that message is returned the moment it comes.

        No request outlives the fetch that made it (each ends with what it delivered), so
        the server hands the next message to whichever worker asks next, and a worker that
        takes messages without getting anywhere (cut off from Redis, say) does not keep
        them coming to itself. A 409 (the consumer changed, a leadership change) ends the
        wait: the caller asks again. Raises :class:`nats.js.errors.APIError` for any other
        status.
        """
        if batch < 1:
            raise ValueError(f"a fetch takes at least one message, not {batch}")
        msgs, _ = self._queued(batch)  # a status found here ended an earlier request
        if msgs:
            return msgs
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        expires_ns = int(timeout * 1e9) - 100_000
        await self._ask(b'{"batch":%d,"expires":%d,"no_wait":true}' % (batch, expires_ns))
        while len(msgs) < batch:
            try:
                msg = await self._next_msg(deadline - loop.time())
            except TimeoutError:
                if msgs:
                    return msgs
                raise
            status = JetStreamContext.is_status_msg(msg)
            if status is None:
                msgs.append(msg)
                more, ended = self._queued(batch - len(msgs))
                msgs += more
                if ended:
                    break
            elif _ends_request(status, msg):
                if msgs or status == "409":
                    break
                return await self._one(batch, deadline)  # 3.
        return msgs

    async def _one(self, batch: int, deadline: float) -> list[Msg]:
        """The first message a request for one brings before ``deadline``, with any queued
        behind it; [] when the wait ends first."""
        loop = asyncio.get_running_loop()
        expires_ns = int((deadline - loop.time()) * 1e9) - 100_000
        if expires_ns <= 0:
            return []
        await self._ask(b'{"batch":1,"expires":%d}' % expires_ns)
        while True:
            msg = await self._next_msg(deadline - loop.time())
            status = JetStreamContext.is_status_msg(msg)
            if status is None:
                return [msg, *self._queued(batch - 1)[0]]
            # This request ends with its message or at the deadline (where the wait ends
            # first): a 404 or 408 now is an earlier request's, and this one stays open.
            if status not in ("404", "408") and _ends_request(status, msg):
                return []

    def _queued(self, limit: int) -> tuple[list[Msg], bool]:
        """Up to ``limit`` messages already delivered to the subscription, without waiting,
        and whether a status that ends a request was taken with them (the 404 that follows
        what a ``no_wait`` request found)."""
        sub = self._sub._sub
        out: list[Msg] = []
        ended = False
        while len(out) < limit and not sub._pending_queue.empty():
            msg = _take(sub)
            status = JetStreamContext.is_status_msg(msg)
            if status is None:
                out.append(msg)
            elif status in _REQUEST_ENDED:
                ended = True
        return out, ended

    async def _ask(self, request: bytes) -> None:
        """Send a pull request (JSON); what it brings arrives on the subscription."""
        ps = self._sub
        await ps._nc.publish(ps._nms, request, ps._deliver)

    async def _next_msg(self, timeout: float) -> Msg:  # noqa: ASYNC109
        if timeout <= 0:
            raise TimeoutError
        return await self._sub._sub.next_msg(timeout=timeout)

    async def close(self) -> None:
        with contextlib.suppress(nats.errors.Error):
            await self._sub.unsubscribe()
