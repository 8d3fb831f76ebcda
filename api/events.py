"""A session's changes as Server-Sent Events: the snapshot, then each commit as it lands.

The stream is :class:`baton.cli.watch.Watch` (the same reader as ``baton watch``): every
item it emits becomes one SSE message whose ``event`` is the item's type (``snapshot``,
``receipt``, ``mark``, ``entry``, ``task``, ``submission``, ``stream``, ``resume``,
``reconnect``) and whose ``data`` is the item as JSON.

Resuming: the ``id`` of a message is the receipt id its change ends at, and it is set only on
the last message of each change (the snapshot's id is the receipt it was read at). A client
that reconnects with ``Last-Event-ID`` (browsers do it themselves) therefore resumes after a
whole change: nothing lost, nothing twice. That holds because a watch emits the items of one
change without awaiting in between, so a change is always in the queue as a whole when the
stream takes items out.

A comment line is sent every :data:`KEEPALIVE_S` of silence, so proxies keep the connection
and a client that went away is noticed. The stream ends when the client leaves or the API
stops; an error of the watch itself (the store lost for a minute) ends it with an ``error``
event carrying problem details.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from baton.cli.watch import Watch
from baton.errors import BatonError
from baton.models import dumps
from baton.settings import Settings

__all__ = ["KEEPALIVE_S", "RETRY_MS", "Watchers", "sse_message", "stream_session"]

KEEPALIVE_S = 15.0
RETRY_MS = 1_000
_END = object()


def sse_message(event: str, data: Any, event_id: str | None = None) -> str:
    """One SSE message (``data`` as one line of JSON)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {dumps(data)}\n\n"


def _frame(items: list[dict[str, Any]]) -> str:
    """The messages of complete changes; ``id`` on the last message of each change."""
    out = []
    for i, item in enumerate(items):
        kind = str(item.get("type", "message"))
        change = item.get("last_id") if kind == "snapshot" else item.get("id")
        if kind == "resume":
            change = item.get("after")
        later = items[i + 1].get("id") if i + 1 < len(items) else None
        last_of_change = change is not None and (kind in ("snapshot", "resume")
                                                 or later != change)
        out.append(sse_message(kind, item, str(change) if last_of_change else None))
    return "".join(out)


class Watchers:
    """The open streams of one API process: counted, and ended together on shutdown."""

    def __init__(self) -> None:
        self.open = 0
        self.stopping = asyncio.Event()


async def stream_session(settings: Settings, session_id: str, after: str | None,
                         watchers: Watchers, *, block_ms: int = 5_000) -> AsyncIterator[str]:
    """The SSE text of ``session_id``'s watch (after receipt ``after`` when resuming)."""
    queue: asyncio.Queue[Any] = asyncio.Queue()
    watch = Watch(settings, session_id, queue.put_nowait, after=after, block_ms=block_ms)

    async def follow() -> None:
        try:
            await watch.run()
        except BatonError as exc:
            queue.put_nowait(exc)
        finally:
            queue.put_nowait(_END)

    watchers.open += 1
    task = asyncio.create_task(follow(), name=f"sse-{session_id}")
    stopping = asyncio.create_task(watchers.stopping.wait())
    try:
        yield f"retry: {RETRY_MS}\n\n"
        while True:
            getter = asyncio.create_task(queue.get())
            done, _ = await asyncio.wait({getter, stopping}, timeout=KEEPALIVE_S,
                                         return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                if stopping in done:
                    return
                yield ": keepalive\n\n"
                continue
            items = [getter.result()]
            while not queue.empty():
                items.append(queue.get_nowait())
            ended = [x for x in items if not isinstance(x, dict)]
            changes = [x for x in items if isinstance(x, dict)]
            if changes:
                yield _frame(changes)
            for x in ended:
                if isinstance(x, BatonError):
                    from baton.api.problems import status_of

                    yield sse_message("error", {"type": f"urn:baton:problem:{x.code}",
                                                "status": status_of(x), "detail": x.message,
                                                "code": x.code, "retryable": x.retryable})
            if ended:
                return
    finally:
        watchers.open -= 1
        stopping.cancel()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
