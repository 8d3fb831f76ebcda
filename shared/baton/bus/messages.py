"""One JetStream message, either side of the bus.

Owns :class:`Outgoing` (what :meth:`~baton.bus.bus.Bus.publish_many` sends), the carrier
headers a relay adds (:func:`carrier_headers`), and for a consumer :func:`delivery_count`,
:func:`carrier_of` (who carried the message, bounded and validated) and :func:`heartbeat`,
which keeps a message alive while it is handled.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import NamedTuple

from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from pydantic import ValidationError as PydanticValidationError

from baton.bus.delivery import delivered, delivered_and_seq
from baton.observability.log import bounded, error_text, get_logger
from baton.receipts import Carrier

__all__ = [
    "RELAY_HEADER", "RELAY_PUBLISHED_HEADER", "Outgoing", "carrier_headers", "carrier_of",
    "delivery_count", "heartbeat", "retry_later", "settle",
]

#: The relay that published a message, and when (ms since the epoch, the relay's clock).
RELAY_HEADER = "Baton-Relay"
RELAY_PUBLISHED_HEADER = "Baton-Published-At"

log = get_logger(__name__)


class Outgoing(NamedTuple):
    """One message for :meth:`Bus.publish_many`."""

    subject: str
    data: bytes
    msg_id: str
    headers: dict[str, str] | None = None


def carrier_headers(relay: str, published_ms: int) -> dict[str, str]:
    """The headers a relay adds to each message it publishes (read back by :func:`carrier_of`)."""
    return {RELAY_HEADER: relay, RELAY_PUBLISHED_HEADER: str(published_ms)}


def carrier_of(msg: Msg) -> Carrier | None:
    """Who carried ``msg``: the relay and publish time from its headers, the outbox row id
    (``Nats-Msg-Id``), its stream sequence and delivery count.

    The headers come from the network: a value that does not fit :class:`Carrier`'s bounds
    drops the carrier (None), it never fails the message. A message without the relay's
    headers (published by an older relay, or directly) still reports its sequence.
    """
    headers = msg.headers or {}
    try:
        delivery, seq = delivered_and_seq(msg)
        published = headers.get(RELAY_PUBLISHED_HEADER, "0")
        return Carrier(
            relay=headers.get(RELAY_HEADER, "")[:129],
            published_ms=int(published) if published.isdigit() and len(published) < 17 else 0,
            row_id=headers.get("Nats-Msg-Id", "")[:513],
            stream_seq=seq,
            delivery=delivery,
        )
    except (PydanticValidationError, NatsError, ValueError, TypeError, IndexError,
            AttributeError) as exc:
        log.warning("carrier_unreadable", subject=msg.subject, error=bounded(exc, 200))
        return None


def delivery_count(msg: Msg) -> int:
    """How many times JetStream has delivered this message (1 on first delivery)."""
    return delivered(msg)


#: The redelivery delay after a server was unreachable doubles from the first up to the
#: cap: the deliveries JetStream allows (``max_deliver``, 8 by default) then span about a
#: minute and a half of outage, not four seconds.
UNAVAILABLE_FIRST_S = 0.5
UNAVAILABLE_CAP_S = 30.0


async def retry_later(msg: Msg, delivery: int, max_deliver: int, what: str) -> str:
    """Hand a message back that could not be handled because Redis or NATS is unreachable.

    NAKed with a backoff by delivery; on the last delivery JetStream allows it is
    terminated instead (it would sit in the stream, never delivered again, until its max
    age): the work it asked for is not lost, the session's progress deadline brings it
    back (a run re-dispatched, the session woken). Returns ``retry`` or ``given_up``.
    """
    if delivery >= max_deliver:
        log.warning("message_given_up", what=what, delivery=delivery, max_deliver=max_deliver,
                    note="servers unreachable through every delivery; the session's "
                         "progress deadline brings the work back")
        await settle(msg.term())
        return "given_up"
    delay = min(UNAVAILABLE_FIRST_S * 2 ** max(delivery - 1, 0), UNAVAILABLE_CAP_S)
    await settle(msg.nak(delay=delay))
    return "retry"


async def settle(op: Awaitable[None]) -> None:
    """Ack / nak / term: fire-and-forget on the wire; a closed connection only logs (the
    redelivery after ack_wait does the same)."""
    try:
        await op
    except Exception as exc:
        log.warning("message_settle_failed", error=error_text(exc))


class Beats:
    """``in_progress`` beats for every message a worker has in hand, sent by one timer loop.

    The per-message :func:`heartbeat` needs a task per message that outlives ``interval``
    and a write per beat; with many messages in hand (a busy Hands) the beats due at one
    tick leave together (one flush). A message is beaten once it has been in hand, since its
    start or its last beat, for ``interval`` s, checked every ``interval / 2``: at most
    ``1.5 * interval`` between beats (pick ``interval`` <= ``ack_wait / 3``). The loop runs
    only while messages are in hand.
    """

    def __init__(self, interval: float, *, late_after_s: float | None = None,
                 on_late: Callable[[float, list[str]], None] | None = None) -> None:
        self.interval = interval
        self._held: dict[int, tuple[Msg, float]] = {}  # id(msg) -> (msg, last beat or start)
        self._task: asyncio.Task[None] | None = None
        self.sent = 0  # beats sent (for tests and benchmarks)
        # A tick this much later than due means the event loop was blocked (a tool calling
        # time.sleep or a synchronous SDK): on_late(seconds late, the held messages'
        # subjects) is told, since the beats (and the attempts' heartbeats) stalled with it
        self.late_after_s, self.on_late = late_after_s, on_late

    @contextlib.asynccontextmanager
    async def beating(self, msg: Msg) -> AsyncIterator[None]:
        """Keep ``msg`` in progress while the body runs."""
        self._held[id(msg)] = (msg, time.monotonic())
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="beats")
        try:
            yield
        finally:
            self._held.pop(id(msg), None)

    async def _run(self) -> None:
        while self._held:
            due_at = time.monotonic() + self.interval / 2
            await asyncio.sleep(self.interval / 2)
            now = time.monotonic()
            if self.on_late is not None and self.late_after_s is not None \
                    and now - due_at > self.late_after_s:
                self.on_late(now - due_at, sorted({m.subject for m, _ in self._held.values()}))
            due = [(key, m) for key, (m, last) in self._held.items()
                   if now - last >= self.interval and not m.is_acked]
            for key, m in due:
                if key in self._held:
                    self._held[key] = (m, now)
                try:
                    await m.in_progress()  # buffered: this tick's beats share one flush
                    self.sent += 1
                except Exception as exc:
                    log.debug("heartbeat_failed", subject=m.subject, error=error_text(exc))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@contextlib.asynccontextmanager
async def heartbeat(msg: Msg, interval: float) -> AsyncIterator[None]:
    """Tell JetStream "still working" (``in_progress``) every ``interval`` s while the body runs.

    Pick ``interval`` well below the consumer's ``ack_wait``. Beats stop once the message is
    acked; a failed beat (e.g. while reconnecting) is logged, not raised. Most bodies end
    before the first beat is due, so the beating task is only created when it is.
    """

    async def beat() -> None:
        while True:
            if msg.is_acked:  # acked, nak'd or terminated: nothing left to keep alive
                return
            try:
                await msg.in_progress()
            except Exception as exc:
                log.debug("heartbeat_failed", subject=msg.subject, error=error_text(exc))
            await asyncio.sleep(interval)

    loop = asyncio.get_running_loop()
    task: asyncio.Task[None] | None = None

    def start() -> None:
        nonlocal task
        task = loop.create_task(beat(), name=f"heartbeat:{msg.subject}")

    timer = loop.call_later(interval, start)
    try:
        yield
    finally:
        timer.cancel()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
