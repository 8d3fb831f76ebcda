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
changes (at most :data:`KEPT_CHANGES`, and ``Settings.api_stream_queue_bytes`` of text) when
the feed has them since that id; else it is first caught up: the changes since its id are
read in batches over the API's pooled connections, without a blocking read (a few at a time,
:data:`CATCHING_UP`), then it joins the feed. So however many streams resume from however
old an id, the API holds one Redis connection per session followed, not one per stream. A
stream that falls :data:`MAX_BEHIND` changes or ``api_stream_queue_bytes`` behind is ended;
its client reconnects with ``Last-Event-ID`` and loses nothing.

Open streams are counted per token and in total (:meth:`Watchers.admit`): past
``Settings.api_max_streams_per_token`` or ``api_max_streams`` a new one is refused (the API
answers 429 with Retry-After), so one reader cannot hold every Redis connection.

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
from collections import Counter, deque
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from baton.cli.watch import Watch
from baton.errors import BatonError
from baton.models import dumps
from baton.observability.log import error_text, get_logger
from baton.settings import Settings
from baton.store.archived import SessionSource
from baton.store.store import Store

__all__ = ["CATCHING_UP", "KEEPALIVE_S", "KEPT_CHANGES", "MAX_BEHIND", "RETRY_MS", "Slot",
           "Watchers", "receipt_order", "sse_message", "stream_session"]

KEEPALIVE_S = 15.0
RETRY_MS = 1_000
KEPT_CHANGES = 1_000  # recent changes a feed keeps for streams resuming behind it
MAX_BEHIND = 5_000  # changes queued for one stream before it is ended (it resumes)
CATCHING_UP = 4  # streams read their way up to a feed at once (each read holds a connection)
_JOIN_TRIES = 3  # catch-ups a stream tries before it ends (its client resumes)
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
    """One client's queue of framed text; ``after``: the last receipt it has. Bounded in
    changes and in bytes (``limit``): past either it is ended, and its client resumes."""

    after: tuple[int, int]
    limit: int
    queue: asyncio.Queue[tuple[str, int] | None] = field(default_factory=asyncio.Queue)
    queued: int = 0  # bytes in ``queue``
    ended: bool = False

    def put(self, text: str | None, size: int | None = None) -> None:
        if self.ended:
            return
        if text is not None:
            size = len(text.encode()) if size is None else size
            if self.queue.qsize() < MAX_BEHIND and self.queued + size <= self.limit:
                self.queued += size
                self.queue.put_nowait((text, size))
                return
        self.ended = True
        self.queue.put_nowait(None)

    def taken(self, item: tuple[str, int] | None) -> str | None:
        """The text of an item taken from ``queue`` (None: the end)."""
        if item is None:
            return None
        self.queued -= item[1]
        return item[0]


class _Feed:
    """One session followed once for every stream watching it."""

    def __init__(self, watchers: Watchers, settings: Settings, session_id: str,
                 start: str) -> None:
        self.watchers = watchers
        self.session_id = session_id
        self.start = receipt_order(start)
        self.floor = self.start  # changes after this are all in ``recent``
        self.recent: deque[tuple[tuple[int, int], str, int]] = deque()  # id, text, bytes
        self.recent_bytes = 0
        self.limit = settings.api_stream_queue_bytes
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
        stream = _Stream(at, self.limit)
        for rid, text, size in self.recent:
            if rid > at:
                stream.put(text, size)
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
            at, size = receipt_order(rid), len(text.encode())
            self.recent.append((at, text, size))
            self.recent_bytes += size
            while len(self.recent) > KEPT_CHANGES or self.recent_bytes > self.limit:
                self.floor, _, dropped = self.recent.popleft()
                self.recent_bytes -= dropped
            for stream in self.streams:
                if at > stream.after:
                    stream.after = at
                    stream.put(text, size)

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


class Slot:
    """One admitted stream, counted against its caller's cap until released (idempotent)."""

    def __init__(self, watchers: Watchers, caller: str) -> None:
        self.watchers, self.caller, self.held = watchers, caller, True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.watchers.open -= 1
            self.watchers.by_caller[self.caller] -= 1
            if self.watchers.by_caller[self.caller] <= 0:
                del self.watchers.by_caller[self.caller]


class Watchers:
    """The open streams and session feeds of one API process; ended together on shutdown."""

    def __init__(self, max_streams: int = 2_000, max_per_caller: int = 1_000) -> None:
        self.open = 0
        self.max_streams, self.max_per_caller = max_streams, max_per_caller
        self.by_caller: Counter[str] = Counter()
        self.feeds: dict[str, _Feed] = {}
        self.streams: set[_Stream] = set()
        self.stopping = asyncio.Event()
        # Streams catching up to a feed read a batch at a time under this, so that however
        # many resume at once they hold a few pooled connections.
        self.reads = asyncio.Semaphore(CATCHING_UP)

    def admit(self, caller: str) -> Slot | None:
        """A slot for one more stream of ``caller`` (a token's key), None past a cap."""
        if self.open >= self.max_streams or self.by_caller[caller] >= self.max_per_caller:
            return None
        self.open += 1
        self.by_caller[caller] += 1
        return Slot(self, caller)

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


async def _catch_up(settings: Settings, session_id: str, after: str, watchers: Watchers,
                    store: Store | None) -> AsyncGenerator[tuple[str, str]]:
    """The changes after ``after``, read a batch at a time over ``store``'s pooled
    connections without waiting for more: (their SSE text, the receipt id reached) each."""
    items: list[dict[str, Any]] = []

    def emit(item: dict[str, Any]) -> None:
        if item.get("type") not in ("resume", "reconnect"):
            items.append(item)

    batches = Watch(settings, session_id, emit, after=after, store=store,
                    first_give_up_s=_PATIENCE_S).catch_up()
    try:
        while True:
            async with watchers.reads:  # not held while the client reads what it got
                reached = await anext(batches, None)
            if reached is None:
                return
            text = "".join(t for _, t in _changes(items))
            items.clear()
            yield text, reached
    finally:
        await batches.aclose()


async def stream_session(settings: Settings, session_id: str, after: str | None,
                         watchers: Watchers, store: Store | None = None,
                         source: SessionSource | None = None,
                         slot: Slot | None = None) -> AsyncIterator[str]:
    """The SSE text of ``session_id``: a snapshot (or, resuming, a resume marker after
    receipt ``after``), then its changes. The snapshot (and a catch-up) is read over
    ``store``'s connections when given (the feeds block on connections of their own).
    ``source``: where the session was found; an archived one is streamed from the archive
    and ended. ``slot``: the stream's place under the caps, released when it ends."""
    stream: _Stream | None = None
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
        tries = 0
        while stream is None:  # the feed cannot tell what came after ``after``: read it
            tries += 1
            if tries > _JOIN_TRIES:
                return  # the session moves faster than this client reads: it resumes
            try:
                async with contextlib.aclosing(_catch_up(settings, session_id, after,
                                                         watchers, store)) as batches:
                    async for text, reached in batches:
                        after = reached
                        if text:
                            yield text
            except BatonError as exc:
                yield _problem(exc)
                return
            stream = watchers.join(settings, session_id, after)
        watchers.streams.add(stream)
        if watchers.stopping.is_set():
            return
        # One awaited get per wake-up (no task, no wait set): with a thousand streams the
        # cost of each wake-up is most of what delivering a change costs.
        while True:
            try:
                async with asyncio.timeout(KEEPALIVE_S):
                    first = stream.taken(await stream.queue.get())
            except TimeoutError:
                yield ": keepalive\n\n"
                continue
            texts = [first]
            while not stream.queue.empty():
                texts.append(stream.taken(stream.queue.get_nowait()))
            yield "".join(t for t in texts if t is not None)
            if None in texts:
                return
    finally:
        if slot is not None:
            slot.release()
        if stream is not None:
            watchers.streams.discard(stream)
            watchers.leave(session_id, stream)
