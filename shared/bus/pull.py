"""Pulling from a durable JetStream consumer.

Owns :class:`Puller` (one fetch loop's reply inbox on a durable consumer, made by
:meth:`~baton.bus.bus.Bus.pull`) and :class:`_Reconnects`, the event that ends a long poll
when the connection was re-established under it.

A Puller speaks JetStream's pull protocol (a request on ``$JS.API.CONSUMER.MSG.NEXT``,
answered on the requester's inbox with messages and status messages) through nats-py's
public client (``new_inbox``, ``subscribe`` with a callback, ``publish``) rather than its
``PullSubscription.fetch``, which has a defect for Baton's workers: when the first answer to
its long poll is a status (one left by an earlier request, say), it asks again for the
whole batch without ``no_wait`` and, once a first message came, waits for the rest of the
batch or the end of the timeout. A wake sat in a Brain for seconds, past the consumer's
ack_wait, came back to another Brain as a redelivery, and its session stalled
(``tests/integration/test_bus.py`` keeps the cases). Wrapping ``fetch`` does not mend it: a
fetch of one message waits well, but a second fetch for the rest of a batch asks with
``expires`` whenever nothing is queued yet, and so waits out its timeout when the stream
holds nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api

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


class _Reconnects:
    """An event set at every reconnect: the pull requests the server held for the old
    connection are gone with it, so a long poll waiting on one must ask again at once."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def fire(self) -> None:
        event, self.event = self.event, asyncio.Event()
        event.set()


class Puller:
    """A reply inbox on one durable consumer, where the server delivers what this Puller's
    pull requests bring. Create with :meth:`subscribe`.

    Each concurrent fetch loop needs its own Puller: fetches on one inbox would take each
    other's messages. ``guard`` and ``reconnects`` are those of the connection.
    """

    def __init__(self, nc: Client, stream: str, durable: str, guard: _Guard | None = None,
                 reconnects: _Reconnects | None = None) -> None:
        self._nc = nc
        self._next = f"{api.DEFAULT_PREFIX}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._inbox = nc.new_inbox()
        self._guard = guard
        self._reconnects = reconnects
        self._sub: Subscription | None = None
        #: delivered to the inbox, not yet fetched: messages and the statuses that end requests
        self._arrived: deque[Msg] = deque()
        self._waiter: asyncio.Future[None] | None = None

    @classmethod
    async def subscribe(cls, nc: Client, stream: str, durable: str, guard: _Guard | None = None,
                        reconnects: _Reconnects | None = None) -> Puller:
        """A Puller on the existing durable consumer ``durable`` of ``stream``."""
        puller = cls(nc, stream, durable, guard, reconnects)
        puller._sub = await nc.subscribe(puller._inbox, cb=puller._arrive)
        return puller

    async def _arrive(self, msg: Msg) -> None:
        """nats-py's callback for each message on the inbox, in the order they came (its
        task calls it for every message already read without a loop turn between)."""
        self._arrived.append(msg)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

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
        """Up to ``batch`` messages, returned as soon as there are any:

        1. messages already delivered to the inbox are taken first, at once;
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
        deadline = asyncio.get_running_loop().time() + timeout
        expires_ns = int(timeout * 1e9) - 100_000
        await self._ask(b'{"batch":%d,"expires":%d,"no_wait":true}' % (batch, expires_ns))
        while len(msgs) < batch:
            try:
                msg = await self._next_msg(deadline)
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
        expires_ns = int((deadline - asyncio.get_running_loop().time()) * 1e9) - 100_000
        if expires_ns <= 0:
            return []
        await self._ask(b'{"batch":1,"expires":%d}' % expires_ns)
        while True:
            msg = await self._next_msg(deadline)
            status = JetStreamContext.is_status_msg(msg)
            if status is None:
                return [msg, *self._queued(batch - 1)[0]]
            # This request ends with its message or at the deadline (where the wait ends
            # first): a 404 or 408 now is an earlier request's, and this one stays open.
            if status not in ("404", "408") and _ends_request(status, msg):
                return []

    def _queued(self, limit: int) -> tuple[list[Msg], bool]:
        """Up to ``limit`` messages already delivered to the inbox, without waiting, and
        whether a status that ends a request was taken with them (the 404 that follows
        what a ``no_wait`` request found)."""
        arrived = self._arrived
        out: list[Msg] = []
        ended = False
        while len(out) < limit and arrived:
            msg = arrived.popleft()
            status = JetStreamContext.is_status_msg(msg)
            if status is None:
                out.append(msg)
            elif status in _REQUEST_ENDED:
                ended = True
        return out, ended

    async def _ask(self, request: bytes) -> None:
        """Send a pull request (JSON); what it brings arrives on the inbox."""
        await self._nc.publish(self._next, request, reply=self._inbox)

    async def _next_msg(self, deadline: float) -> Msg:
        """The next message or status on the inbox, waiting until ``deadline`` (the loop's
        clock) at most; raises TimeoutError then."""
        if not self._arrived:
            if self._nc.is_closed:
                raise nats.errors.ConnectionClosedError
            loop = asyncio.get_running_loop()
            if deadline <= loop.time():
                raise nats.errors.TimeoutError
            self._waiter = waiter = loop.create_future()
            try:
                async with asyncio.timeout_at(deadline):
                    await waiter
            finally:
                self._waiter = None
        return self._arrived.popleft()

    async def close(self) -> None:
        """Unsubscribe the inbox; what it held unfetched comes back after ack_wait."""
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
