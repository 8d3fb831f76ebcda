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

The call is stopped by cancelling the pass's own asyncio task from the renewer (as a lost
lease is), not by racing the call against a second task: a model call that is not
interrupted costs nothing more than it did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from baton.models import Task

__all__ = ["CancelWatch", "Interrupted", "interruptible"]

T = TypeVar("T")


class Interrupted(Exception):
    """The call was stopped: a cancel request concerns its task."""


class CancelWatch:
    """The cancel targets the pass's last lease renewal found in the inbox, and the call in
    progress that one of them may stop."""

    def __init__(self) -> None:
        self.targets: frozenset[str] = frozenset()
        # The call in progress: its task, the session's tasks, the asyncio task awaiting it.
        self._calling: tuple[Task, Mapping[str, Task], asyncio.Task[Any]] | None = None
        self._stopping = False

    def reset(self) -> None:
        """A schedule begins: it takes up every cancel waiting now (brain.cancel), so what
        an earlier renewal saw is stale; later renewals tell of later ones."""
        self.targets = frozenset()

    def saw(self, targets: frozenset[str]) -> None:
        """A renewal's answer: stop the call in progress if a cancel concerns its task."""
        self.targets = targets
        calling = self._calling
        if calling is not None and not self._stopping and self.concerns(calling[0], calling[1]):
            self._stopping = True
            calling[2].cancel()

    async def guard(self, call: Coroutine[Any, Any, T], task: Task, tasks: Mapping[str, Task],
                    me: asyncio.Task[Any]) -> T:
        """Await ``call`` in ``me`` (the pass's task), which :meth:`saw` cancels when a
        cancel concerns ``task``: then :class:`Interrupted`."""
        if self.concerns(task, tasks):
            call.close()
            raise Interrupted(task.id)
        self._calling, self._stopping = (task, tasks, me), False
        try:
            result = await call
        except asyncio.CancelledError:
            if not self._stopping:  # the caller's cancellation: it goes on
                raise
            me.uncancel()  # our own stop, not a cancellation of the pass
            raise Interrupted(task.id) from None
        finally:
            stopping, self._calling, self._stopping = self._stopping, None, False
        if stopping:  # the call swallowed the stop and answered: keep the answer
            me.uncancel()
        return result

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


async def interruptible(call: Coroutine[Any, Any, T], task: Task, tasks: Mapping[str, Task],
                        watch: CancelWatch | None) -> T:
    """Await ``call``; raise :class:`Interrupted` (the call cancelled) once ``watch`` sees a
    cancel request that concerns ``task``."""
    me = asyncio.current_task()
    if watch is None or me is None:
        return await call
    return await watch.guard(call, task, tasks, me)
