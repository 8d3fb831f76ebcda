"""A cancel that arrives while a pass is busy with a long call stops that call.

A cancel request waits in the session's inbox until a Brain loads the session. A pass that
is in a model call (seconds, or minutes for a long streamed answer) would finish the call,
commit its answer, and only then look. But the pass renews its lease every third of the
lease time while it works, and each renewal (renew.lua) names the targets of the cancel
requests waiting in the inbox. :class:`CancelWatch` keeps them for the pass; a call made
through :func:`interruptible` is stopped as soon as one concerns its task (the task itself,
one of its ancestors, or ``*``), and the caller commits nothing: the pass loads the session
again under the same lease and carries the request out. Each schedule starts with what it
takes up (:meth:`CancelWatch.reset`), so a cancel already carried out never stops a call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import TypeVar

from baton.models import Task

__all__ = ["CancelWatch", "Interrupted", "interruptible"]

T = TypeVar("T")

CLEANUP_S = 2.0  # how long a stopped call may take to clean up


class Interrupted(Exception):
    """The call was stopped: a cancel request concerns its task."""


class CancelWatch:
    """The cancel targets the pass's last lease renewal found in the inbox."""

    def __init__(self) -> None:
        self.targets: frozenset[str] = frozenset()
        self.changed = asyncio.Event()

    def reset(self) -> None:
        """A schedule begins: it takes up every cancel waiting now (brain.cancel), so what
        an earlier renewal saw is stale; later renewals tell of later ones."""
        self.targets = frozenset()
        self.changed.clear()

    def saw(self, targets: frozenset[str]) -> None:
        self.targets = targets
        if targets:
            self.changed.set()

    def concerns(self, task: Task, tasks: Mapping[str, Task]) -> bool:
        """Whether a waiting cancel targets ``task``, an ancestor of it, or every task."""
        if not self.targets:
            return False
        if "*" in self.targets:
            return True
        seen: set[str] = set()
        current: Task | None = task
        while current is not None and current.id not in seen:
            if current.id in self.targets:
                return True
            seen.add(current.id)
            current = tasks.get(current.parent) if current.parent else None
        return False


async def interruptible(call: Awaitable[T], task: Task, tasks: Mapping[str, Task],
                        watch: CancelWatch | None) -> T:
    """Await ``call``; raise :class:`Interrupted` (the call cancelled) once ``watch`` sees a
    cancel request that concerns ``task``."""
    if watch is None:
        return await call
    work = asyncio.ensure_future(call)
    try:
        while True:
            if watch.concerns(task, tasks):
                raise Interrupted(task.id)
            waiter = asyncio.ensure_future(watch.changed.wait())
            try:
                await asyncio.wait({work, waiter}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
            if work.done():
                return work.result()
            watch.changed.clear()  # looked at below: another task's cancel waits on
    finally:
        if not work.done():
            work.cancel()
            # Its own clean-up (a stream closed, streamed text saved), bounded: a call may
            # swallow its cancellation (redis-py does, mid-command).
            await asyncio.wait({work}, timeout=CLEANUP_S)
        if work.done() and not work.cancelled():
            work.exception()  # retrieved: an error after the interruption is not logged
