"""Canonical per-message lines at a bounded cost: the unusual ones in full, the routine counted.

Every handled message (a tool message in Hands, a wake in a Brain) ends with one canonical
line. At high rates those lines cost a noticeable share of a service's CPU, while the routine
ones (first delivery, the expected outcome, nothing recovered) say little that the receipts
in Redis (every handoff of every session, always kept) and the metrics do not already say.
So :class:`CanonicalLines` logs:

* an unusual message (any other outcome, a redelivery, a recovery) in full at INFO;
* a routine message at DEBUG only (``BATON_LOG_EACH_MESSAGE=1`` logs it at INFO again), and
  counts it: one ``<event>_summary`` INFO line ``every_s`` after the first message it
  counts (a timer of the running loop: a burst followed by quiet is told on time, and a
  process with nothing counted never wakes for it), and at :meth:`flush`, on stop, carries
  the number of routine messages, their mean and slowest time, and the outcomes seen.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import structlog

from baton.observability.log import BatonLogger

__all__ = ["SUMMARY_EVERY_S", "CanonicalLines"]

SUMMARY_EVERY_S = 10.0


class CanonicalLines:
    """The canonical line of ``event`` for each handled message of one process."""

    def __init__(self, log: BatonLogger, event: str, every_s: float = SUMMARY_EVERY_S,
                 *, each: bool = False) -> None:
        self.log = log
        self.each = each  # every line at INFO (settings.log_each_message)
        self.event = event
        self.every_s = every_s
        self._since = time.monotonic()
        self._count = 0
        self._ms_total = 0.0
        self._ms_max = 0.0
        self._outcomes: Counter[str] = Counter()
        self._timer: asyncio.TimerHandle | None = None

    def line(self, routine: bool, *, outcome: str, ms: float, **fields: Any) -> None:
        """Log the canonical line of one message (in full unless ``routine``)."""
        if not routine or self.each:
            self.log.info(self.event, outcome=outcome, ms=ms, **fields)
            return
        self.log.debug(self.event, outcome=outcome, ms=ms, **fields)
        now = time.monotonic()
        if not self._count:  # the first of a window: its summary is due every_s from now
            self._since = now
            self._arm()
        self._count += 1
        self._ms_total += ms
        self._ms_max = max(self._ms_max, ms)
        self._outcomes[outcome] += 1
        if now - self._since >= self.every_s:
            self.flush()

    def _arm(self) -> None:
        """Tell the window's summary when it is due, also if no message comes after it."""
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): the next line or flush tells
            return
        self._timer = loop.call_later(self.every_s, self._due)

    def _due(self) -> None:
        self._timer = None
        if self._count:
            self.flush()

    def flush(self) -> None:
        """Log the summary of the routine messages counted since the last one, if any."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = time.monotonic()
        if self._count:  # not about the message in hand: without its bound ids and trace
            saved = structlog.contextvars.get_contextvars()
            structlog.contextvars.clear_contextvars()
            try:
                self._summary(now)
            finally:
                structlog.contextvars.bind_contextvars(**saved)
        self._since = now
        self._count = 0
        self._ms_total = self._ms_max = 0.0
        self._outcomes.clear()

    def _summary(self, now: float) -> None:
        self.log.info(f"{self.event}_summary", routine=self._count,
                      window_s=round(now - self._since, 1),
                      ms_mean=round(self._ms_total / self._count, 2),
                      ms_max=round(self._ms_max, 2), outcomes=dict(self._outcomes),
                      trace_id=None)
