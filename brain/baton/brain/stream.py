"""Streamed text for watchers: throttled, losable partial commits of a model's answer.

While a model streams, :class:`PartialText` collects the text and, at most every
``Settings.model_partial_interval_ms``, appends the text that came since the last save with
one small script (partial.lua) that also appends a ``partial`` receipt carrying it, which
``baton watch`` prints as it comes. Each save sends and writes only that new text, at the
offset where the saved text ends (a save retried after it landed, or one the store did not
get, is refused and answered with where the saved text ends, and the next save sends the
text from there): a streamed answer costs bytes linear in its length. Losable: a save never
blocks the stream (at most one is in flight; deltas that arrive meanwhile go with the next
one), a failed save is dropped (the next one carries its text), and a stale fence writes
nothing. A partial is never a response: the next commit clears it,
and a Brain that takes over after a crash turns it into an ``interrupted`` entry.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from baton.brain.context import TaskContext


class PartialText:
    """The text of one model attempt; ``add`` is the client's ``on_text``.

    Use as ``async with PartialText(...) as partial:``; leaving stops the saver (an unsaved
    tail is not saved: the commit that follows holds the whole answer) after a save in
    flight finished.
    """

    def __init__(self, ctx: TaskContext, task_id: str, request_id: str) -> None:
        self.ctx = ctx
        self.task_id = task_id
        self.request_id = request_id
        self.parts: list[str] = []
        self.saved = 0  # characters announced by a saved partial
        self.saves = 0
        # The parts saved so far, and the saved text's UTF-8 bytes (the next save's offset);
        # ends: each saved length in bytes -> the parts it covered, to send the text again
        # from where the store says the saved text ends.
        self._saved_parts = 0
        self._saved_bytes = 0
        self._ends: dict[int, tuple[int, int]] = {0: (0, 0)}
        self._interval = ctx.settings.model_partial_interval_ms / 1000
        self._more = asyncio.Event()
        self._saver: asyncio.Task[None] | None = None
        self._inflight: asyncio.Future[None] | None = None
        self._started = time.monotonic()

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def add(self, delta: str) -> None:
        self.parts.append(delta)
        self._more.set()

    async def __aenter__(self) -> PartialText:
        self._saver = asyncio.create_task(self._run(), name=f"partial:{self.task_id}")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._saver is not None:
            self._saver.cancel()
            await asyncio.gather(self._saver, return_exceptions=True)
        if self._inflight is not None and not self._inflight.done():
            # Let a save already sent finish first, so it cannot land after the commit that
            # follows (which clears the partial).
            await asyncio.wait({self._inflight}, timeout=2.0)

    async def _run(self) -> None:
        last = 0.0
        while True:
            await self._more.wait()
            wait = last + self._interval - time.monotonic()
            if wait > 0:  # throttled: deltas arriving meanwhile join this save
                await asyncio.sleep(wait)
            self._more.clear()
            last = time.monotonic()
            # The throttle's own clock goes with the save, so a reader can check the interval
            # on it: Redis's receipt times also carry each save's trip to Redis.
            at_ms = int((last - self._started) * 1000)
            self._inflight = asyncio.ensure_future(self._save(at_ms))
            await asyncio.shield(self._inflight)

    async def _save(self, at_ms: int) -> None:
        upto = len(self.parts)
        delta = "".join(self.parts[self._saved_parts:upto])
        if not delta:
            return
        ctx = self.ctx
        chars = self.saved + len(delta)
        end = self._saved_bytes + len(delta.encode("utf-8", "surrogatepass"))
        self._ends[end] = (upto, chars)  # also when its reply is lost but the save landed
        try:
            at = await ctx.store.save_partial(
                ctx.session_id, ctx.fence, ctx.worker, task_id=self.task_id,
                request_id=self.request_id, offset=self._saved_bytes, delta=delta,
                chars=chars, at_ms=at_ms,
            )
        except Exception as exc:  # losable: the next save carries this delta too
            ctx.log.debug("partial_dropped", task_id=self.task_id, error=str(exc))
            return
        if at is None:  # a stale fence: nothing saved
            return
        if at == end:
            self._saved_parts, self.saved, self._saved_bytes = upto, chars, at
            self.saves += 1
        elif at in self._ends:
            # The saved text ends elsewhere (an earlier save landed though its reply was
            # lost): the next save sends the text from there, at once.
            self._saved_parts, self.saved = self._ends[at]
            self._saved_bytes = at
            self._more.set()
