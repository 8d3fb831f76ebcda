"""A session's changes as Server-Sent Events: the snapshot, then each commit as it lands.

Every item :class:`baton.cli.watch.Watch` emits (the reader of ``baton watch``) becomes one SSE
message whose ``event`` is the item's type (``snapshot``, ``receipt``, ``mark``, ``entry``,
``task``, ``submission``, ``stream``, ``resume``) and whose ``data`` is the item as JSON.

Resuming: the ``id`` of a message is the receipt id its change ends at, set only on the last
message of each change (the snapshot's id is the receipt it was read at). A client that
reconnects with ``Last-Event-ID`` therefore resumes after a whole change: nothing lost,
nothing twice. A watch emits the items of one change without awaiting in between, so a
change is always complete when it is framed.

One feed per session: however many streams watch a session, the API process follows it with
one :class:`Watch` (one blocking read, one read of each change), frames each change once and
hands the text to every stream. A new stream reads its own snapshot, then takes the feed's
changes after the snapshot's receipt. A resumed stream takes them from the feed's recent
changes (:data:`KEPT_CHANGES`) when the feed has them since that id, else it follows with a
watch of its own. A stream that falls :data:`MAX_BEHIND` changes behind is ended; its client
reconnects with ``Last-Event-ID`` and loses nothing.

An archived session (:mod:`baton.store.archived`) is read from the archive: its snapshot (or,
resuming, its changes after the id), then an ``archived`` event, and the stream ends: nothing
in it changes until a new submission restores it. A session archived while streamed ends its
stream the same way (its feed's watch notices the tombstone when idle); the API answers a
reconnect after its newest change with 204 No Content, which tells an EventSource to stop.

A comment line is sent every :data:`KEEPALIVE_S` of silence, so proxies keep the connection
and a client that went away is noticed. A stream ends when the client leaves or the API stops;
an error of the watch itself (the store lost for a minute) ends it with an ``error`` event
carrying problem details.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from baton.cli.watch import Watch
from baton.errors import BatonError
from baton.models import dumps
from baton.observability.log import error_text, get_logger
from baton.settings import Settings
from baton.store.archived import SessionSource
from baton.store.store import Store

__all__ = ["KEEPALIVE_S", "KEPT_CHANGES", "MAX_BEHIND", "RETRY_MS", "Watchers", "receipt_order",
           "sse_message", "stream_session"]

KEEPALIVE_S = 15.0
RETRY_MS = 1_000
KEPT_CHANGES = 1_000  # recent changes a feed keeps for streams resuming behind it
MAX_BEHIND = 5_000  # changes queued for one stream before it is ended (it resumes)
log = get_logger("baton.api")
_PATIENCE_S = 60.0


def sse_message(event: str, data: Any, event_id: str | None = None) -> str:
    """One SSE message (``data`` as one line of JSON)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {dumps(data)}\n\n"


def receipt_order(receipt_id: str) -> tuple[int, int]:
    ms, _, seq = receipt_id.partition("-")
    return int(ms), int(seq or 0)


def _changes(items: list[dict[str, Any]]) -> list[tuple[str | None, str]]:
    """Complete changes framed: (receipt id or None, SSE text) each, the id on the last
    message of each change."""
    out: list[tuple[str | None, str]] = []
    group: list[str] = []
    for i, item in enumerate(items):
        kind = str(item.get("type", "message"))
        change = item.get("last_id") if kind == "snapshot" else \
            item.get("after") if kind == "resume" else item.get("id")
        later = items[i + 1].get("id") if i + 1 < len(items) else None
        last = change is None or kind in ("snapshot", "resume") or later != change
        group.append(sse_message(kind, item, str(change) if last and change else None))
        if last:
            out.append((str(change) if change else None, "".join(group)))
            group = []
    return out


def _problem(exc: BatonError) -> str:
    from baton.api.problems import status_of

    return sse_message("error", {"type": f"urn:baton:problem:{exc.code}",
                                 "status": status_of(exc), "detail": exc.message,
                                 "code": exc.code, "retryable": exc.retryable})


@dataclass(eq=False)
class _Stream:
    """One client's queue of framed text; ``after``: the last receipt it has."""

    after: tuple[int, int]
    queue: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)
    ended: bool = False

    def put(self, text: str | None) -> None:
        if self.ended:
            return
        if text is None or self.queue.qsize() >= MAX_BEHIND:
            self.ended = True
            self.queue.put_nowait(None)
            return
        self.queue.put_nowait(text)


class _Feed:
    """One session followed once for every stream watching it."""

    def __init__(self, watchers: Watchers, settings: Settings, session_id: str,
                 start: str) -> None:
        self.watchers = watchers
        self.session_id = session_id
        self.start = receipt_order(start)
        self.floor = self.start  # changes after this are all in ``recent``
        self.recent: deque[tuple[tuple[int, int], str]] = deque()
        self.streams: set[_Stream] = set()
        self._pending: list[dict[str, Any]] = []
        self._flush_at: asyncio.Handle | None = None
        # The API reached the store already: a feed retries as long as any watch does.
        self.watch = Watch(settings, session_id, self._emit, after=start,
                           first_give_up_s=_PATIENCE_S)
        self.task = asyncio.create_task(self._follow(), name=f"sse-feed-{session_id}")

    def join(self, after: str) -> _Stream | None:
        """A stream for a client that has everything up to ``after``; None when this feed
        cannot tell what came between (it started later, or dropped those changes)."""
        at = receipt_order(after)
        if at < self.floor:
            return None
        stream = _Stream(at)
        for rid, text in self.recent:
            if rid > at:
                stream.put(text)
        self.streams.add(stream)
        return stream

    def leave(self, stream: _Stream) -> None:
        if stream not in self.streams:
            return
        self.streams.discard(stream)
        if not self.streams:
            self.watchers.feeds.pop(self.session_id, None)
            self.task.cancel()

    def _emit(self, item: dict[str, Any]) -> None:
        if item.get("type") in ("resume", "reconnect"):
            return
        self._pending.append(item)
        if self._flush_at is None:  # after this change: its items come without an await
            self._flush_at = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_at = None
        items, self._pending = self._pending, []
        for rid, text in _changes(items):
            if rid is None:
                continue
            at = receipt_order(rid)
            self.recent.append((at, text))
            if len(self.recent) > KEPT_CHANGES:
                self.floor = self.recent.popleft()[0]
            for stream in self.streams:
                if at > stream.after:
                    stream.after = at
                    stream.put(text)

    async def _follow(self) -> None:
        try:
            await self.watch.run()
            if self.watch.source.archived:  # archived while followed: say so, and end
                self._end(sse_message("archived", self.watch.archived_item()))
                return
        except BatonError as exc:
            log.warning("sse_feed_ended", session_id=self.session_id, code=exc.code,
                        error=exc.message[:300], streams=len(self.streams))
            self._end(_problem(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: the streams end, the clients reconnect
            log.warning("sse_feed_failed", session_id=self.session_id, error=error_text(exc)[:300])
        self._end(None)

    def _end(self, last: str | None) -> None:
        if self.watchers.feeds.get(self.session_id) is self:
            del self.watchers.feeds[self.session_id]
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush()
        for stream in list(self.streams):
            if last is not None:
                stream.put(last)
            stream.put(None)


class Watchers:
    """The open streams and session feeds of one API process; ended together on shutdown."""

    def __init__(self) -> None:
        self.open = 0
        self.feeds: dict[str, _Feed] = {}
        self.streams: set[_Stream] = set()
        self.stopping = asyncio.Event()

    def stop(self) -> None:
        """End every stream (after what it was already handed) and refuse new ones."""
        self.stopping.set()
        for stream in list(self.streams):
            stream.put(None)

    def join(self, settings: Settings, session_id: str, after: str) -> _Stream | None:
        feed = self.feeds.get(session_id)
        if feed is None:
            feed = self.feeds[session_id] = _Feed(self, settings, session_id, after)
        return feed.join(after)

    def leave(self, session_id: str, stream: _Stream) -> None:
        feed = self.feeds.get(session_id)
        if feed is not None:
            feed.leave(stream)


async def _private(settings: Settings, session_id: str, after: str,
                   stream: _Stream) -> None:
    """Follow with a watch of this stream's own (resuming from before any feed's changes)."""
    pending: list[dict[str, Any]] = []

    def emit(item: dict[str, Any]) -> None:
        if item.get("type") in ("resume", "reconnect"):
            return
        if not pending:
            asyncio.get_running_loop().call_soon(flush)
        pending.append(item)

    def flush() -> None:
        for _, text in _changes(pending):
            stream.put(text)
        pending.clear()

    try:
        await Watch(settings, session_id, emit, after=after,
                    first_give_up_s=_PATIENCE_S).run()
        flush()  # it ended (archived): what it emitted last is not flushed yet
    except BatonError as exc:
        flush()
        stream.put(_problem(exc))
    stream.put(None)


async def stream_session(settings: Settings, session_id: str, after: str | None,
                         watchers: Watchers, store: Store | None = None,
                         source: SessionSource | None = None) -> AsyncIterator[str]:
    """The SSE text of ``session_id``: a snapshot (or, resuming, a resume marker after
    receipt ``after``), then its changes. The snapshot is read over ``store``'s connections
    when given (the feeds block on connections of their own). ``source``: where the
    session was found; an archived one is streamed from the archive and ended."""
    watchers.open += 1
    stream: _Stream | None = None
    private: asyncio.Task[None] | None = None
    try:
        yield f"retry: {RETRY_MS}\n\n"
        items: list[dict[str, Any]] = []
        if source is not None and source.archived:
            # What the archive holds (after ``after``), then the archived event: the watch
            # of an archived session ends by itself.
            try:
                await Watch(settings, session_id, items.append, after=after, store=store,
                            source=source).run()
            except BatonError as exc:
                yield "".join(text for _, text in _changes(items)) + _problem(exc)
                return
            yield "".join(text for _, text in _changes(items))
            return
        if after is None:
            watch = Watch(settings, session_id, items.append, store=store)
            try:
                after = await watch.snapshot()
            except BatonError as exc:
                yield _problem(exc)
                return
            if watch.source.archived:  # archived since the request was checked
                items.append(watch.archived_item())
            yield "".join(text for _, text in _changes(items))
            if watch.source.archived:
                return
        else:
            yield sse_message("resume", {"type": "resume", "after": after}, after)
        stream = watchers.join(settings, session_id, after)
        if stream is None:
            stream = _Stream(receipt_order(after))
            private = asyncio.create_task(_private(settings, session_id, after, stream))
        watchers.streams.add(stream)
        if watchers.stopping.is_set():
            return
        # One awaited get per wake-up (no task, no wait set): with a thousand streams the
        # cost of each wake-up is most of what delivering a change costs.
        while True:
            try:
                async with asyncio.timeout(KEEPALIVE_S):
                    first = await stream.queue.get()
            except TimeoutError:
                yield ": keepalive\n\n"
                continue
            texts = [first]
            while not stream.queue.empty():
                texts.append(stream.queue.get_nowait())
            yield "".join(t for t in texts if t is not None)
            if None in texts:
                return
    finally:
        watchers.open -= 1
        if stream is not None:
            watchers.streams.discard(stream)
        if private is not None:
            private.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await private
        elif stream is not None:
            watchers.leave(session_id, stream)
