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

A consumer whose leader died delivers nothing until the survivors elect another (4 to 9 s
in nats-server), and a pull request the dead leader held is never answered. A Puller finds
out within :data:`SILENT_BEATS` heartbeats: its waiting requests ask for an idle heartbeat
(``consumer_heartbeat_s``, with replicated streams), and one that stops hearing from the
consumer asks again; a consumer with no leader refuses that at once
(503). Until the consumer answers again, the Puller reads its subject from the stream with
direct gets, which every replica answers, and takes the relay's copies of messages the
stream could not store (:mod:`baton.bus.fallback`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api

from baton.bus.delivery import delivered_and_seq
from baton.bus.fallback import FallbackMsg
from baton.bus.nats_auth import _Guard
from baton.observability.log import error_text, get_logger

__all__ = ["SILENT_BEATS", "Puller"]

log = get_logger(__name__)

#: A Puller that hears nothing, not even an idle heartbeat, for this many heartbeats asks
#: again: a consumer whose leader died answers no request it held, and refuses a new one
#: (503) until one is elected.
SILENT_BEATS = 3
#: While the consumer has no leader: how often the Puller asks it again and reads the
#: stream for messages it has not read yet (each a direct get, answered by any replica).
AROUND_POLL_S = 0.1
#: Deliveries queued here at most when a relay's copy comes (more copies are left untaken:
#: the relay sends them again, JetStream delivers them once it has them).
MAX_COPIES = 10_000
#: Messages handed out by pulls, kept to skip them when reading around the consumer (the
#: ones still in hand); acknowledged ones are forgotten when there are more than this.
_HANDED_PRUNE_AT = 4096
#: How long a direct get or a probe of the consumer may take.
_AROUND_TIMEOUT_S = 1.0

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


class _Silent(Exception):
    """A waiting pull request heard nothing, not even a heartbeat, for :data:`SILENT_BEATS`."""


class Puller:
    """A reply inbox on one durable consumer, where the server delivers what this Puller's
    pull requests bring. Create with :meth:`subscribe`.

    Each concurrent fetch loop needs its own Puller: fetches on one inbox would take each
    other's messages. ``guard`` and ``reconnects`` are those of the connection. With
    ``subject`` (the consumer's filter subject) the Puller reads around a consumer that has
    no leader; :meth:`subscribe` with ``fallback`` makes it take the relay's copies sent
    there, one Puller of the queue group named after the consumer each
    (:mod:`baton.bus.fallback`).
    """

    def __init__(self, nc: Client, stream: str, durable: str, guard: _Guard | None = None,
                 reconnects: _Reconnects | None = None, subject: str = "",
                 heartbeat_s: float = 0.0) -> None:
        self._nc = nc
        self._heartbeat_ns = int(heartbeat_s * 1e9)
        self._stream, self._durable = stream, durable
        self._next = f"{api.DEFAULT_PREFIX}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._direct = f"{api.DEFAULT_PREFIX}.DIRECT.GET.{stream}"
        self._subject = subject
        self._js = nc.jetstream(timeout=_AROUND_TIMEOUT_S)
        self._inbox = nc.new_inbox()
        self._guard = guard
        self._reconnects = reconnects
        self._subs: list[Subscription] = []
        #: delivered to the inbox, not yet fetched: messages, the statuses that end
        #: requests, and the relay's copies (FallbackMsg)
        self._arrived: deque[Msg] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._heard = 0.0  # the loop's time when the inbox last received anything
        self._beating = False  # the last request asked for idle heartbeats
        #: The consumer had no leader at the last look: fetches read around it. The stream
        #: sequence to read from next (direct gets read messages without consuming them).
        self.around = False
        self._cursor = 0
        self._handed: dict[int, Msg] = {}  # stream seq -> message pulled, maybe in hand
        self.read_around = 0  # messages read from the stream around the consumer

    @classmethod
    async def subscribe(cls, nc: Client, stream: str, durable: str, guard: _Guard | None = None,
                        reconnects: _Reconnects | None = None, subject: str = "",
                        fallback: str = "", heartbeat_s: float = 0.0) -> Puller:
        """A Puller on the existing durable consumer ``durable`` of ``stream``; its waiting
        requests ask for an idle heartbeat every ``heartbeat_s`` (0: none)."""
        puller = cls(nc, stream, durable, guard, reconnects, subject, heartbeat_s)
        puller._subs.append(await nc.subscribe(puller._inbox, cb=puller._arrive))
        if fallback:
            puller._subs.append(await nc.subscribe(fallback, queue=durable, cb=puller._copy))
        return puller

    async def _arrive(self, msg: Msg) -> None:
        """nats-py's callback for each message on the inbox, in the order they came (its
        task calls it for every message already read without a loop turn between)."""
        self._arrived.append(msg)
        self._heard = asyncio.get_running_loop().time()
        self._wake()

    async def _copy(self, msg: Msg) -> None:
        """A relay's copy of a message the stream could not take: queued as a delivery, and
        the relay told it was taken (an empty answer), so it sends it to nobody else."""
        if len(self._arrived) >= MAX_COPIES:
            return  # untaken: the relay sends it again, JetStream delivers it once stored
        self._arrived.append(FallbackMsg.of(self._nc, self._subject or msg.subject, msg.data,
                                            msg.headers, self._stream))
        self._wake()
        if msg.reply:
            with contextlib.suppress(nats.errors.Error):
                await self._nc.publish(msg.reply, b"")

    def _wake(self) -> None:
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
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            if not self.around:
                msgs = await self._guarded("pull from", self._next, self._pull(batch, timeout))
                self._hand_out(msgs)
                return msgs
        except TimeoutError:  # nats.errors.TimeoutError: nothing came
            return []
        except (_Silent, nats.js.errors.ServiceUnavailableError) as exc:
            if not self._subject:
                if isinstance(exc, _Silent):
                    return []  # asked again at the next fetch
                raise
        try:
            msgs = await self._guarded("read the stream of", self._direct,
                                       self._fetch_around(batch, deadline))
        except TimeoutError:
            return []
        self._hand_out(msgs)
        return msgs

    async def _guarded(self, action: str, subject: str, call: Awaitable[list[Msg]]) -> list[Msg]:
        if self._guard is None:
            return await call
        return await self._guard(action, subject, call)

    def _hand_out(self, msgs: list[Msg]) -> None:
        """Note the pulled messages among ``msgs`` (by stream sequence): reading around the
        consumer skips those still in hand here."""
        handed = self._handed
        for msg in msgs:
            if isinstance(msg, FallbackMsg):
                continue
            with contextlib.suppress(Exception):  # not a JetStream delivery: nothing to skip
                handed[delivered_and_seq(msg)[1]] = msg
        if len(handed) > _HANDED_PRUNE_AT:
            self._prune()

    def _prune(self) -> None:
        for seq in [seq for seq, msg in self._handed.items() if msg.is_acked]:
            del self._handed[seq]

    async def _fetch_around(self, batch: int, deadline: float) -> list[Msg]:
        """Messages while the consumer has no leader (``around``): the relay's copies queued
        here, then the consumer's subject read from the stream, from where the last read
        ended, skipping what is in hand here; each poll first asks the consumer, and its
        answer (any, but 503) ends the detour with what it brought."""
        loop = asyncio.get_running_loop()
        while True:
            msgs, _ = self._queued(batch)
            if len(msgs) < batch:
                try:
                    msgs += await self._probe(batch - len(msgs))
                except nats.js.errors.ServiceUnavailableError:
                    if not self.around:
                        self.around, self._cursor = True, 0
                        self._prune()
                        log.warning("consumer_without_leader", stream=self._stream,
                                    consumer=self._durable,
                                    note="reading its subject from the stream's replicas "
                                         "until one is elected")
                    msgs += await self._read_stream(batch - len(msgs))
                else:
                    if self.around:
                        self.around = False
                        log.info("consumer_back", stream=self._stream, consumer=self._durable,
                                 read_around=self.read_around)
                    return msgs
            if msgs:
                return msgs
            if deadline <= loop.time():
                return []
            with contextlib.suppress(TimeoutError):
                await self._arrival(min(deadline, loop.time() + AROUND_POLL_S))

    async def _probe(self, batch: int) -> list[Msg]:
        """Ask the consumer for up to ``batch`` messages without waiting for any: what it
        has ([] for none). Raises ServiceUnavailableError when it has no leader (503), or
        when no answer comes within :data:`_AROUND_TIMEOUT_S`."""
        await self._ask(b'{"batch":%d,"no_wait":true}' % batch)
        deadline = asyncio.get_running_loop().time() + _AROUND_TIMEOUT_S
        msgs: list[Msg] = []
        while len(msgs) < batch:
            try:
                msg = await self._next_msg(deadline)
            except TimeoutError:
                if msgs:
                    return msgs
                raise nats.js.errors.ServiceUnavailableError from None
            status = JetStreamContext.is_status_msg(msg)
            if status is None:
                msgs.append(msg)
            elif self._ends(status, msg, msgs):
                break
        return msgs

    async def _read_stream(self, limit: int) -> list[Msg]:
        """Up to ``limit`` messages of the consumer's subject from the stream (direct gets,
        any replica answers), after the last one read; those in hand here are skipped."""
        out: list[Msg] = []
        while len(out) < limit:
            try:
                raw = await self._js.get_msg(self._stream, seq=self._cursor,
                                             subject=self._subject, direct=True, next=True)
            except nats.js.errors.NotFoundError:
                break
            except (nats.errors.Error, TimeoutError) as exc:
                log.info("stream_read_failed", stream=self._stream, error=error_text(exc))
                break
            seq = int(raw.seq or 0)
            self._cursor = seq + 1
            held = self._handed.get(seq)
            if held is not None and not held.is_acked:
                continue
            self.read_around += 1
            out.append(FallbackMsg.of(self._nc, raw.subject or self._subject, raw.data or b"",
                                      raw.headers, self._stream, seq))
        return out

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
        await self._ask(b'{"batch":%d,"expires":%d,"no_wait":true%s}'
                        % (batch, expires_ns, self._heartbeat(expires_ns)))
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
                # a relay's copy answers no request: no 404 follows it to end the wait
                if ended or isinstance(msg, FallbackMsg):
                    break
            elif self._ends(status, msg, msgs):
                if msgs or status == "409":
                    break
                return await self._one(batch, deadline)  # 3.
        return msgs

    def _ends(self, status: str, msg: Msg, msgs: list[Msg]) -> bool:
        """:func:`_ends_request`; a refusal (a 503: the consumer has no leader) puts the
        messages taken so far back first (relay's copies among them), for the next fetch."""
        try:
            return _ends_request(status, msg)
        except nats.js.errors.ServiceUnavailableError:
            self._arrived.extendleft(reversed(msgs))
            msgs.clear()
            raise

    async def _one(self, batch: int, deadline: float) -> list[Msg]:
        """The first message a request for one brings before ``deadline``, with any queued
        behind it; [] when the wait ends first."""
        expires_ns = int((deadline - asyncio.get_running_loop().time()) * 1e9) - 100_000
        if expires_ns <= 0:
            return []
        await self._ask(b'{"batch":1,"expires":%d%s}' % (expires_ns,
                                                        self._heartbeat(expires_ns)))
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

    def _heartbeat(self, expires_ns: int) -> bytes:
        """The idle heartbeat field of a pull request waiting ``expires_ns`` (none for a short
        wait: the server refuses a heartbeat longer than half the wait)."""
        beat = self._heartbeat_ns
        return b',"idle_heartbeat":%d' % beat if beat and expires_ns >= 4 * beat else b""

    async def _ask(self, request: bytes) -> None:
        """Send a pull request (JSON); what it brings arrives on the inbox. The silence of a
        request that asked for heartbeats counts from now."""
        self._heard = asyncio.get_running_loop().time()
        self._beating = b"idle_heartbeat" in request
        await self._nc.publish(self._next, request, reply=self._inbox)

    async def _next_msg(self, deadline: float) -> Msg:
        """The next message or status on the inbox, waiting until ``deadline`` (the loop's
        clock) at most; raises TimeoutError then, or :class:`_Silent` first when the request
        asked for heartbeats and none came for :data:`SILENT_BEATS` of them."""
        if not self._arrived:
            if self._nc.is_closed:
                raise nats.errors.ConnectionClosedError
            loop = asyncio.get_running_loop()
            if deadline <= loop.time():
                raise nats.errors.TimeoutError
            silent_at = (self._heard + SILENT_BEATS * self._heartbeat_ns / 1e9
                         if self._beating else deadline)
            try:
                await self._arrival(min(deadline, silent_at))
            except TimeoutError:
                if silent_at < deadline and not self._arrived and not self._nc.is_closed:
                    raise _Silent from None
                raise
        return self._arrived.popleft()

    async def _arrival(self, until: float) -> None:
        """Wait for the next delivery to the inbox (or a relay's copy) until ``until`` (the
        loop's clock); raises TimeoutError then."""
        self._waiter = waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout_at(until):
                await waiter
        finally:
            self._waiter = None

    async def close(self) -> None:
        """Unsubscribe the inbox; what it held unfetched comes back after ack_wait."""
        for sub in self._subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        self._subs.clear()
