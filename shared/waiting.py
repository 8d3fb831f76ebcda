"""How a client waits for committed state: re-read it on each settled notification.

Waiting does not fan out: a commit that settles something SPUBLISHes on the session's own
sharded channel (:meth:`Keys.settled_channel`, under the session's hash tag), and a client
SSUBSCRIBEs only to the channels of the sessions it is waiting on, for as long as it waits
(:class:`~baton.store.settled.SettledChannels`). A client therefore hears about its own
sessions only, however many others settle, and on a Redis Cluster the notification stays on
the node of the session's slot. A settled submission's notification carries the committed
record (:mod:`baton.store.notices`), which :meth:`Waiting.wait` returns without reading it
back.

Reads while Redis is away (a restart, a failover) are waited out to the wait's own deadline;
once Redis answers, a read tells a store that lost its state (StoreEpochError) from a live
one, and a session that cannot be decoded from one that is quarantined (QuarantinedError).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.exceptions as rex

from baton.errors import (
    CorruptStateError,
    NotFoundError,
    UnavailableError,
    ValidationError,
    WaitTimeout,
    from_redis_error,
    not_found,
)
from baton.models import Submission, Task
from baton.observability.log import error_text, get_logger
from baton.settings import Settings
from baton.store import quarantine
from baton.store.epoch import StoreEpoch
from baton.store.notices import submission_in
from baton.store.settled import SettledChannels
from baton.store.state import is_request
from baton.store.store import Store

__all__ = ["Waiting"]

# redis-py's errors for a server that does not answer (a read is retried past them).
# ClusterDownError / TryAgainError: a Redis Cluster mid-failover (a slot without a primary
# for a moment) answers reads that way; like a restart, it is waited out.
_UNREACHABLE: tuple[type[Exception], ...] = (UnavailableError, rex.ConnectionError,
                                            rex.TimeoutError, rex.ClusterDownError,
                                            rex.TryAgainError, OSError)

log = get_logger("baton.client")
T = TypeVar("T")


class Waiting:
    """The waits of a client: for a submission to settle, a task to end, cancelled work to
    stop. Needs the client's ``store``, ``settings``, ``settled`` channels and ``epoch``."""

    store: Store
    settings: Settings
    settled: SettledChannels
    epoch: StoreEpoch | None

    async def _why_waiting(self, session_id: str) -> str:
        """What a wait that timed out most likely waits for, in words (a hint)."""
        return "is a Brain serving its agent running?"

    def _no_session(self, session_id: str) -> NotFoundError:
        return not_found(f"session {session_id}", namespace=self.store.keys.ns,
                         session_id=session_id)

    async def wait_task(self, session_id: str, task_id: str, timeout: float = 60.0) -> Task:  # noqa: ASYNC109
        """Wait until the task is terminal; returns it."""
        return await self._until(session_id, lambda: self.store.task(session_id, task_id),
                                 lambda t: t.terminal, timeout,
                                 what=f"task {task_id} has not ended")

    async def wait(self, submission: Submission, timeout: float = 60.0) -> Submission:  # noqa: ASYNC109
        """Wait until the submission settles (completed, failed or cancelled)."""
        # While its request waits in the inbox it is not settled: nothing to decode then.
        # The first read (right after the submit, as a rule) looks at the inbox first, the
        # later ones (after a settled notification) at the submission first.
        reads = 0

        def read() -> Awaitable[Submission | None]:
            nonlocal reads
            reads += 1
            return self.store.taken_up(submission, fresh=reads == 1 and not submission.settled)

        settled = await self._until(submission.session_id, read,
                                    lambda s: s is not None and s.settled, timeout,
                                    notice=lambda message: submission_in(message, submission),
                                    what=f"submission {submission.id} has not settled")
        assert settled is not None  # done() holds
        return settled

    async def wait_cancelled(self, session_id: str, task_id: str | None = None,
                             timeout: float = 60.0) -> bool:  # noqa: ASYNC109
        """Wait until the task (or every task of the session) has ended; True then.
        NotFoundError for a session (or task) that does not exist."""
        if task_id is None and not await self._read_checked(
                lambda: self.store.exists(session_id), session_id):
            raise self._no_session(session_id)

        async def ended() -> bool:
            if task_id is not None:
                return (await self.store.task(session_id, task_id)).terminal
            sk = self.store.keys.session(session_id)
            async with self.store.redis.pipeline(transaction=False) as p:
                p.hlen(sk.tasks)
                p.hkeys(sk.inbox)
                live, inbox = await p.execute()
            # A request no Brain took up yet is work too: its task exists only once taken
            return not live and not any(is_request(str(k)) for k in inbox)

        what = f"task {task_id}" if task_id else "the cancelled work"
        return await self._until(session_id, ended, bool, timeout, what=f"{what} has not ended")

    async def _until(
        self, session_id: str, read: Callable[[], Awaitable[T]], done: Callable[[T], bool],
        timeout: float,  # noqa: ASYNC109
        notice: Callable[[Any], T | None] | None = None, what: str = "the work has not ended",
    ) -> T:
        """Re-read on each settled notification of the session (or every second) until done.

        ``notice`` reads a notification's message: what it returns, when ``done`` holds for
        it, is the answer without a read (see :mod:`baton.store.notices`).

        A quarantined session never settles: that is checked when a second passed without a
        notification (and by a read that fails to decode), not before every wait, which would
        cost each waiter one more round trip."""
        channel = self.store.keys.settled_channel(session_id)
        unreachable: list[BaseException] = []  # the last read's error while Redis is away
        signal = await self.settled.join(channel)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    # Redis away for a while (a restart, a failover) is waited out to the
                    # wait's own deadline: the work goes on meanwhile
                    current = await self._read_checked(read, session_id, patience=timeout,
                                                       unreachable=unreachable)
                    if done(current):
                        return current
                    # Wake on a notification, or re-check at least every second.
                    await asyncio.wait({signal}, timeout=1.0)
                    if signal.done():
                        message = signal.result()
                        signal = self.settled.again(channel, signal)
                        heard = notice(message) if notice is not None else None
                        if heard is not None and done(heard):
                            return heard
                    else:
                        # Redis unreachable here (a restart, a failover) is the next read's
                        # to wait out, and then to tell a lost state from a live one.
                        with contextlib.suppress(*_UNREACHABLE):
                            await quarantine.raise_if_quarantined(self.store, session_id)
        except TimeoutError:  # the wait's own deadline (asyncio.timeout's), nothing else's
            why = (f"Redis unreachable: {error_text(unreachable[0])}" if unreachable
                   else await self._why_waiting(session_id))
            raise WaitTimeout(
                f"{what} in session {session_id} within {timeout:g} s; it goes on ({why}): "
                f"follow it with `baton watch {session_id}`, look at it with `baton inspect "
                f"{session_id}`", session_id=session_id, why=why) from None
        finally:
            await self.settled.leave(channel, signal)

    async def _read_checked(self, read: Callable[[], Awaitable[T]], session_id: str, *,
                            patience: float | None = None,
                            unreachable: list[BaseException] | None = None) -> T:
        """``read()``; its NotFoundError becomes StoreEpochError when the store lost its state,
        and a failure to decode the session becomes QuarantinedError once it is quarantined.

        Redis unreachable (restarting, a failover) is waited out for up to ``patience``
        seconds (``client_connect_wait_s`` by default; a wait passes its own deadline, and
        ``unreachable`` gets the last error while it lasts): once it answers, the read says
        whether the state is still there, or the epoch that it was lost.
        """
        loop = asyncio.get_running_loop()
        since: float | None = None
        limit = self.settings.client_connect_wait_s if patience is None else patience
        while True:
            try:
                value = await read()
                if unreachable:
                    unreachable.clear()
                return value
            except (CorruptStateError, ValidationError):
                await quarantine.raise_if_quarantined(self.store, session_id)
                raise
            except NotFoundError:
                if self.epoch is not None:
                    await self.epoch.verify()
                raise
            except _UNREACHABLE as exc:
                since = since if since is not None else loop.time()
                if unreachable is not None:
                    unreachable[:] = [exc]
                if loop.time() - since >= limit:
                    raise from_redis_error(exc, session_id=session_id) from exc
                log.debug("wait_read_retry", error=str(exc))
                await asyncio.sleep(0.2)
