"""One JetStream message, either side of the bus.

Owns :class:`Outgoing` (what :meth:`~baton.bus.bus.Bus.publish_many` sends), and for a consumer
:func:`delivery_count` and :func:`heartbeat`, which keeps a message alive while it is handled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import NamedTuple

import structlog
from nats.aio.msg import Msg

__all__ = ["Outgoing", "delivery_count", "heartbeat"]

log = structlog.get_logger(__name__)


class Outgoing(NamedTuple):
    """One message for :meth:`Bus.publish_many`."""

    subject: str
    data: bytes
    msg_id: str
    headers: dict[str, str] | None = None


def delivery_count(msg: Msg) -> int:
    """How many times JetStream has delivered this message (1 on first delivery)."""
    return int(msg.metadata.num_delivered)


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
                log.debug("heartbeat_failed", subject=msg.subject, error=repr(exc))
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
