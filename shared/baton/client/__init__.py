"""The client side: submit input to a session and wait for its submission to settle.

Clients never take leases: they write only through idempotent scripts (submit, start,
cancel, approve) and read committed state.

Waiting does not fan out: a commit that settles something SPUBLISHes on the session's own
sharded channel (:meth:`Keys.settled_channel`, under the session's hash tag), and a client
SSUBSCRIBEs only to the channels of the sessions it is waiting on, for as long as it waits.
A client therefore hears about its own sessions only, however many others settle, and on a
Redis Cluster the notification stays on the node of the session's slot. A settled
submission's notification carries the committed record (:mod:`baton.store.notices`), which
:meth:`Client.wait` returns without reading it back.

Writes wait out a store that refuses them for now: a Redis Cluster failing over (the slot's
primary gone until a replica is promoted: CLUSTERDOWN, connections refused) or a primary's
split-brain guard (NOREPLICAS, too few replicas acknowledging). Every write of a client is
idempotent, by its request id (submit, start) or by what it decides (a cancel's target, a
run's decision), so it is tried again, for up to ``client_connect_wait_s``, the client's
patience with the store, as for its connect and its reads; then one
:class:`~baton.errors.RedisUnavailable` sentence names the session's slot, the node serving
it and the last reason.

Reads fall through to the archive: a session archived after its retention
(:mod:`baton.store.retention`) answers :meth:`Client.wait`, :meth:`Client.task`,
:meth:`Client.document` and the other reads as it answered them live, read from its archive
object (:mod:`baton.store.archived`; the archive, ``Settings.archive_location()``, is opened
when first needed). :meth:`Client.archival` says whether, and since when, it is archived.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from baton.archive import decode as decode_archive
from baton.bus.subjects import BusNames
from baton.client.input import (
    GENERATION,
    check_agent,
    check_compat,
    check_task,
    derived_id,
    session_for,
)
from baton.client.reads import SessionReads
from baton.errors import (
    ArchivedError,
    BatonError,
    ConfigError,
    ConflictError,
    CorruptStateError,
    NotFoundError,
    RedisUnavailable,
    StoreFullError,
    UnavailableError,
    ValidationError,
    WaitTimeout,
    WriteInDoubtError,
    from_redis_error,
    not_found,
)
from baton.faults import Faults
from baton.models import Document, Submission, Task, ToolRun
from baton.observability.log import get_logger
from baton.settings import Settings
from baton.store import quarantine, retention
from baton.store.admission import (
    DEFAULT_PRIORITY,
    AdmissionGate,
    AdmissionQueue,
    check_priority,
    check_tenant,
)
from baton.store.archived import Archival, ArchivedReads, SessionSource
from baton.store.control import CancelAnswer
from baton.store.documents import read_document
from baton.store.epoch import StoreEpoch
from baton.store.notices import submission_in
from baton.store.redis_client import REDIS_ERRORS
from baton.store.replication import shard_of, where
from baton.store.settled import SettledChannels
from baton.store.state import is_request
from baton.store.store import Store, now_ms, worker_ref

log = get_logger("baton.client")
#: A level found served by a live Brain is taken as served this long (seconds) before
#: the liveness records are read again for new input.
SERVED_RECHECK_S = 10.0
#: How long a write to an archived session waits for a Brain to restore it.
RESTORE_WAIT_S = 30.0
T = TypeVar("T")
#: How long a wait that timed out may spend finding out what it waits for (a hint).
WHY_READ_S = 2.0
#: What a client's write or its reads raise while the store is away or refusing for now.
_STORE_AWAY: tuple[type[Exception], ...] = (RedisUnavailable, *REDIS_ERRORS)


@dataclass(frozen=True)
class Approval:
    """A tool run that waits for a person's decision (:meth:`Client.approve` or
    :meth:`Client.reject`): what it would do, and the digest an approval is bound to."""

    run_id: str
    task_id: str
    tool: str
    arguments: dict[str, Any]
    digest: str
    requested_ms: int  # when its intent was committed (epoch milliseconds)


class Connecting:
    """What :meth:`Client.connect` returns: await it for the client, or use it as
    ``async with Client.connect(settings) as client:`` (closed on the way out)."""

    def __init__(self, cls: type[Client], settings: Settings) -> None:
        self._cls, self._settings = cls, settings
        self._client: Client | None = None

    def __await__(self) -> Generator[Any, None, Client]:
        return self._cls._connect(self._settings).__await__()

    async def __aenter__(self) -> Client:
        self._client = await self._cls._connect(self._settings)
        return self._client

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._client is not None:
            await self._client.close()


class Client:
    """Submit and wait; one per process, shares the store connection.

    Made by ``await Client.connect(settings)`` (or ``async with Client.connect(settings)
    as client``), closed by :meth:`close`.
    """

    def __init__(self, store: Store, settings: Settings) -> None:
        if not isinstance(store, Store) or not isinstance(settings, Settings):
            raise ConfigError("a Client is made by `await Client.connect(settings)`, not "
                              "Client(...)")
        self.store = store
        self.settings = settings
        self.names = BusNames(settings.namespace)
        self.worker = worker_ref("client", settings.worker_id("client"))
        self.faults = Faults(settings.fault)
        self.admission = AdmissionQueue(store.redis, store.keys, settings)
        self._gate = AdmissionGate(self.admission, settings)
        #: Log a warning when input would wait for a Brain (the CLI and the API tell it in
        #: their own words, and turn it off).
        self.warn_unserved = True
        # (agent, compat, task kind) -> when to read the liveness records again
        self._served: dict[tuple[str, int, str], float] = {}
        self.settled = SettledChannels(store.redis)  # what the waits listen to
        #: Where reads find an archived session (the archive is opened when first needed).
        self.archived = ArchivedReads(store)
        self.reads = SessionReads(store, settings, self.settled, self.archived)

    @classmethod
    def connect(cls, settings: Settings) -> Connecting:
        """Connect and read the store's epoch (StoreEpochError if the store lost its state):
        ``await`` it, or ``async with`` it."""
        if not isinstance(settings, Settings):
            raise ConfigError(f"Client.connect takes a baton.Settings, not "
                              f"{type(settings).__name__}")
        return Connecting(cls, settings)

    @classmethod
    async def _connect(cls, settings: Settings) -> Client:
        client = cls(await Store.connect(settings), settings)
        try:
            client.reads.epoch = await client._establish_epoch()
        except BaseException:
            await client.store.close()
            raise
        return client

    async def _establish_epoch(self) -> StoreEpoch:
        """The store's epoch, waiting up to ``client_connect_wait_s`` while Redis refuses
        for now (a replica catching up, a failover in progress); then RedisUnavailable."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.client_connect_wait_s
        delay = 0.05
        while True:
            try:
                return await StoreEpoch.establish(self.store.redis, self.store.keys)
            except RedisUnavailable as exc:
                if loop.time() + delay > deadline:
                    raise
                log.debug("store_epoch_retry", error=str(exc), retry_in_s=delay)
            await asyncio.sleep(delay)  # a backoff between attempts, not a wait for an event
            delay = min(delay * 2, 1.0)

    @property
    def epoch(self) -> StoreEpoch | None:
        """The store's epoch read by :meth:`connect`: a "not found" is checked against it,
        so a store that lost its state raises StoreEpochError instead."""
        return self.reads.epoch

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def notifications(self) -> int:
        """Settled notifications this client heard (for tests and the fan-out benchmark)."""
        return self.settled.heard

    @property
    def wait_fallbacks(self) -> int:
        """Waits of this client that found their submission settled by the once-a-second
        re-read without hearing its notification (should stay 0; see
        :mod:`baton.client.reads`)."""
        return self.reads.fallbacks

    async def close(self) -> None:
        """Stop listening for settled sessions and close the connections and the archive;
        idempotent."""
        await self.settled.close()
        await self.archived.close()
        await self.store.close()

    async def archival(self, session_id: str) -> Archival | None:
        """The session's archival (when, under which fence, as which object) when it is
        archived, its keys gone from Redis to the archive; None while Redis holds it.
        NotFoundError when neither has it."""
        return (await self.archived.require(session_id)).archival

    async def submit(
        self,
        text: str,
        *,
        agent: str,
        compat: int = 1,
        session_id: str | None = None,
        request_id: str | None = None,
        require_brain: bool = False,
        tenant: str | None = None,
        priority: int = DEFAULT_PRIORITY,
    ) -> tuple[Submission, bool]:
        """Accept ``text`` once per request id; returns (submission, created).

        Without ``session_id`` the session is derived from ``request_id`` (a new one when
        neither is given), so resubmitting the same request id returns the same submission.
        When no live Brain serves the agent at that level (an unknown agent, a level no
        Brain runs yet) the input is kept and waits for one, with a ``no_live_brain``
        warning in the log; ``require_brain=True`` refuses it instead
        (:class:`~baton.errors.UnavailableError`, nothing written).

        ``tenant`` (default: the settings' ``tenant``) and ``priority`` (1 first .. 5 last)
        place a new session in the fair admission of new sessions, when ``admission_window``
        turns it on (baton.store.admission). Past ``max_waiting`` or
        ``max_waiting_per_tenant`` a new session is refused with
        :class:`~baton.errors.BacklogFullError` (retryable), nothing written.
        """
        tenant = check_tenant(self.settings.tenant if tenant is None else tenant)
        check_priority(priority)
        if not isinstance(text, str):
            raise ValidationError(f"a submission's text is a string, not "
                                  f"{type(text).__name__}")
        if not text.strip():
            raise ConfigError("nothing to submit: the text is empty")
        check_agent(agent)
        check_compat(compat)
        given = session_id
        named = bool(session_id or request_id)  # may have been archived: see _restoring
        session_id = session_for(session_id, request_id)
        request_id = request_id or uuid.uuid4().hex
        sub_id = derived_id("sub", session_id, request_id)
        task = Task(
            id=derived_id("gen", session_id, request_id),
            kind=GENERATION,
            owner=session_id,
            submission_id=sub_id,
            input={"agent": agent},
            created_ms=now_ms(),
        )
        def write(probe: bool) -> Awaitable[tuple[Submission, bool]]:
            return self.store.inbox.submit(
                session_id,
                agent=agent,
                compat=compat,
                wake_subject=self.names.wake_subject(agent, compat),
                request_id=request_id,
                text=text,
                task=task,
                worker=self.worker,
                submission_id=sub_id,
                probe=probe,
                tenant=tenant,
                priority=priority,
            )

        async def checked() -> tuple[Submission, bool]:
            await self._check_served(agent, compat, given, require_brain, "submitted")
            await self._within_bounds(given, session_id, tenant)
            return await self._restoring(session_id, write, named)

        async with self._quarantine_named(session_id):
            result = await self._patient("submit", session_id, checked)
        self.faults.hit("submit.after_commit")
        return result

    async def _within_bounds(self, given: str | None, session_id: str, tenant: str) -> None:
        """BacklogFullError when a write that opens a session would pass a bound on waiting
        work (baton.store.admission); a session named by the caller counts when Redis does
        not hold it yet (one read, only while bounds are set)."""
        if not self._gate.bounded:
            return
        if given is None or not await self.store.inbox.exists(session_id):
            await self._gate.check(tenant)

    async def _patient(self, what: str, session_id: str, write: Callable[[], Awaitable[T]],
                       ) -> T:
        """``write()``, tried again while the store refuses it for now, for up to
        ``client_connect_wait_s`` (see the module docstring); then RedisUnavailable naming
        the session's shard and the last reason.

        Safe because a client's writes are idempotent (see the module docstring). A write in
        doubt (WriteInDoubtError: it ran, no replica acknowledged it) is not tried again
        here: the store retried it with its commit id for its own budget
        (``redis_in_doubt_retry_ms``) already, and a decision tried again under a new one
        would be refused as decided."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.settings.client_connect_wait_s
        delay = 0.05
        while True:
            try:
                return await write()
            except (WriteInDoubtError, StoreFullError):  # (full: its own answer, at once)
                raise
            except _STORE_AWAY as exc:  # (a read's error is redis-py's own)
                error = from_redis_error(exc, session_id=session_id)
                if not isinstance(error, RedisUnavailable):
                    raise
                if loop.time() + delay > deadline:
                    raise self._refused(what, session_id, error, loop.time() - started) \
                        from None
                log.info("client_write_waiting", what=what, session_id=session_id,
                         error=str(error), retry_in_s=delay)
            await asyncio.sleep(delay)  # a backoff between attempts, not a wait for an event
            delay = min(delay * 2, 1.0)

    def _refused(self, what: str, session_id: str, exc: RedisUnavailable, waited: float
                 ) -> RedisUnavailable:
        """One sentence: what was refused, for which session, on which shard (slot and node,
        on a cluster), for how long, and why."""
        slot, node = exc.fields.get("slot"), str(exc.fields.get("node") or "")
        if slot is None:
            slot, node = shard_of(self.store.redis, self.store.keys.session(session_id).meta)
        cause = str(exc.fields.get("cause") or exc)
        return RedisUnavailable(
            f"redis refused {what} for session {session_id}{where(slot, node)} for "
            f"{waited:.1f} s: {cause}", cause=cause, slot=slot, node=node,
            session_id=session_id)

    async def _check_served(self, agent: str, compat: int, session_id: str | None,
                            require: bool, doing: str, kind: str = GENERATION) -> None:
        """Warn (or with ``require``, refuse) when no live Brain serves the input's level,
        or (a task) none of those that do knows its kind.

        A level found served is not read again for :data:`SERVED_RECHECK_S` (input for a
        new session; an existing one is served at its own level, read each time)."""
        key = (agent, compat, kind)
        if not require and (not self.warn_unserved or (
                session_id is None and self._served.get(key, 0.0) > time.monotonic())):
            return
        try:
            message = await self.waits(agent, compat, session_id=session_id, kind=kind)
        except _STORE_AWAY as exc:
            if require:  # the check is the caller's condition: it waits with the write
                raise
            # Only a warning hangs on it: the write goes on, and waits for the store itself.
            log.debug("served_check_skipped", agent=agent, compat=compat, error=str(exc))
            return
        if not message:
            if session_id is None:
                self._served[key] = time.monotonic() + SERVED_RECHECK_S
            return
        if require:
            raise UnavailableError(f"{message}; not {doing} (require_brain)", agent=agent,
                                   compat=compat)
        log.warning("no_live_brain", agent=agent, compat=compat,
                    note=f"{message}: the input is kept and waits until one starts")

    async def waits(self, agent: str, compat: int = 1, *, session_id: str | None = None,
                    kind: str = GENERATION) -> str:
        """Why input for ``agent`` at ``compat`` (or for the existing session's own level),
        or a task of ``kind``, would wait for a Brain: no live Brain serves that level, or
        none of those that do knows the kind. "" when it would be taken up."""
        from baton.store.workers import services, unknown_kind, unserved

        message = await unserved(self.store.redis, self.store.keys, now_ms(), agent, compat,
                                 session_id)
        if not message and kind != GENERATION:
            announced = await services(self.store.redis, self.store.keys, now_ms())
            message = unknown_kind(announced, agent, compat, kind)
        return message

    async def live_brains(self, agent: str, compat: int = 1) -> list[str]:
        """Names of the live Brains that consume ``agent``'s wakes at level ``compat``.

        Read from the services' announcements; empty means input would wait (durably) until
        such a Brain starts.
        """
        from baton.store.workers import live_brains, services

        announced = await services(self.store.redis, self.store.keys, now_ms())
        return live_brains(announced, agent, compat)

    async def start_task(
        self,
        session_id: str | None,
        kind: str,
        input: dict[str, Any] | None = None,
        *,
        agent: str,
        compat: int = 1,
        request_id: str | None = None,
        require_brain: bool = False,
        tenant: str | None = None,
        priority: int = DEFAULT_PRIORITY,
    ) -> tuple[str, str, bool]:
        """Start a root task of ``kind`` once per request id; (session id, task id, created).

        The session is created for ``agent`` if new: the Brains serving that agent run it.
        Without ``session_id`` it is derived from ``request_id`` (see :func:`session_for`).
        When no live Brain serves the agent at that level, or none of them knows ``kind``,
        the task is kept and waits for one, with a warning in the log; ``require_brain=True``
        refuses it instead (:class:`~baton.errors.UnavailableError`, nothing written).
        ``tenant`` and ``priority``: as :meth:`submit`'s, for a new session.
        """
        tenant = check_tenant(self.settings.tenant if tenant is None else tenant)
        check_priority(priority)
        check_task(kind, input)
        check_agent(agent)
        check_compat(compat)
        given = session_id
        named = bool(session_id or request_id)  # may have been archived: see _restoring
        session_id = session_for(session_id, request_id)
        request_id = request_id or uuid.uuid4().hex
        now = now_ms()
        task = Task(id=derived_id(kind, session_id, request_id), kind=kind,
                    input=dict(input or {}), owner=session_id, created_ms=now, updated_ms=now)
        def write(probe: bool) -> Awaitable[tuple[str, bool]]:
            return self.store.inbox.start_task(
                session_id, agent=agent, compat=compat,
                wake_subject=self.names.wake_subject(agent, compat), request_id=request_id,
                task=task, worker=self.worker, probe=probe, tenant=tenant, priority=priority,
            )

        async def checked() -> tuple[str, bool]:
            await self._check_served(agent, compat, given, require_brain, "started", kind)
            await self._within_bounds(given, session_id, tenant)
            return await self._restoring(session_id, write, named)

        async with self._quarantine_named(session_id):
            task_id, created = await self._patient("start", session_id, checked)
        if not created:  # the same request id: the same start, or a conflict
            first = await self.reads.checked(
                lambda source: source.store.inbox.task(session_id, task_id), session_id)
            if first.kind != task.kind or first.input != task.input:
                raise ConflictError(
                    f"request id {request_id} in session {session_id} was used before to "
                    f"start task {task_id} ({first.kind}) with "
                    f"{'another kind' if first.kind != task.kind else 'a different input'}",
                    session_id=session_id, task_id=task_id)
        return session_id, task_id, created

    async def _restoring(self, session_id: str, write: Callable[[bool], Awaitable[T]],
                         named: bool) -> T:
        """``write(probe)``; when it is refused ARCHIVED (the session left Redis for the
        archive), a Brain is asked to restore the session, the restore waited for, and
        ``write`` runs once more, on the live session (its request id checked against the
        restored ones).

        A session the caller ``named`` (by id, or by a request id it derives from) may be
        archived with its tombstone expired (``BATON_TOMBSTONE_TTL_S``): Redis has nothing of
        it, and a plain write would open a new session under the old id, its history cut
        off. So the first write probes: when Redis has no such session the archive is asked
        (one read by id) and, when it holds the session, a Brain restores it first, as
        above. A new session so costs one more round trip to Redis and one to the archive;
        a write to a session Redis holds, or one with neither id, costs nothing more."""
        try:
            try:
                return await write(named)
            except NotFoundError:  # a probe: Redis has no such session
                wake = await self._archived_wake(session_id)
                if wake is None:
                    return await write(False)
                await self._restored(session_id, wake)
        except ArchivedError:
            await self._restored(session_id)
        return await write(False)

    async def _archived_wake(self, session_id: str) -> str | None:
        """The wake subject of the session's archive object; None when the archive has none
        (a new session) or when it cannot be read (logged: the write then opens a new
        session, as before archival existed)."""
        try:
            data = await self.archived.archive.get(self.store.keys.ns, session_id)
        except BatonError as exc:
            log.warning("archive_unreadable_for_new_session", session_id=session_id,
                        error=str(exc))
            return None
        if data is None:
            return None
        return decode_archive(data).meta.get("wake") or None

    async def _restored(self, session_id: str, wake: str = "") -> None:
        """Ask the Brains to bring the archived session back (baton.store.retention) and
        wait until one did: its ``restored:`` notification, or no tombstone left (asked
        again every second meanwhile). ``wake``: the archive object's wake subject, for a
        session whose tombstone expired (see :meth:`_restoring`)."""
        channel = self.store.keys.settled_channel(session_id)
        signal = await self.settled.join(channel)
        try:
            async with asyncio.timeout(RESTORE_WAIT_S):
                while await retention.ask_restore(self.store, session_id, wake):
                    await asyncio.wait({signal}, timeout=1.0)
                    if signal.done():
                        signal = self.settled.again(channel, signal)
        except TimeoutError:
            raise WaitTimeout(
                f"session {session_id} is archived and no Brain restored it within "
                f"{RESTORE_WAIT_S:g} s; is a Brain serving its agent running?",
                session_id=session_id, why="a Brain to restore the archived session") from None
        finally:
            await self.settled.leave(channel, signal)
        log.info("session_restored_for_input", session_id=session_id)

    @contextlib.asynccontextmanager
    async def _quarantine_named(self, session_id: str) -> AsyncIterator[None]:
        """A write refused over corrupt state says so when the session is quarantined."""
        try:
            yield
        except CorruptStateError:
            await quarantine.raise_if_quarantined(self.store, session_id)
            raise

    async def cancel(self, session_id: str, task_id: str | None = None, *,
                     reason: str = "") -> CancelAnswer:
        """Cancel a task (or every root task of the session); idempotent.

        The intent is committed at once; a Brain then stops the tasks' phases, aborts their
        children bottom-up, stops their tool runs and commits the terminal state (a
        generation task's submission settles ``cancelled``).
        """
        return await self._patient("cancel", session_id, lambda: self.store.decisions.cancel(
            session_id, task_id, self.worker, reason))

    async def wait_cancelled(self, session_id: str, task_id: str | None = None,
                             timeout: float = 60.0) -> bool:  # noqa: ASYNC109
        """Wait until the task (or every task of the session) has ended; True then.
        NotFoundError for a session (or task) that does not exist."""
        async def exists(source: SessionSource) -> None:
            if not await source.store.inbox.exists(session_id):
                raise self._no_session(session_id)

        if task_id is None:
            await self.reads.checked(exists, session_id)

        async def ended(source: SessionSource) -> bool:
            if task_id is not None:
                return (await source.store.inbox.task(session_id, task_id)).terminal
            sk = self.store.keys.session(session_id)
            async with source.redis.pipeline(transaction=False) as p:
                p.hlen(sk.tasks)
                p.hkeys(sk.inbox)
                live, inbox = await p.execute()
            if not live and not inbox and not source.archived:  # gone: archived since?
                await exists(source)
            # A request no Brain took up yet is work too: its task exists only once taken
            return not live and not any(is_request(str(k)) for k in inbox)

        what = f"task {task_id}" if task_id else "the cancelled work"
        return await self.reads.until(session_id, ended, bool, timeout,
                                      what=f"{what} has not ended", why=self._why_waiting)

    async def approve(self, session_id: str, run_id: str, digest: str) -> int:
        """Approve a run awaiting approval, bound to its arguments' digest (see
        :meth:`awaiting_approval`); it is dispatched once. Returns the sequence number of
        the commit that recorded the decision. ConflictError for another digest or a run
        already decided."""
        return await self._patient("approve", session_id, lambda: self.store.decisions.approve(
            self.names, session_id, run_id, digest, self.worker))

    async def reject(self, session_id: str, run_id: str, reason: str = "") -> int:
        """Reject a run awaiting approval: it ends with error code ``rejected``. Returns the
        sequence number of the commit that recorded the decision."""
        return await self._patient("reject", session_id, lambda: self.store.decisions.reject(
            session_id, run_id, self.worker, reason))

    async def awaiting_approval(self, session_id: str) -> list[Approval]:
        """The session's tool runs waiting for a decision, oldest first: pass one's
        ``run_id`` and ``digest`` to :meth:`approve` (the digest binds the approval to the
        arguments shown), or its ``run_id`` to :meth:`reject`."""
        async def read(source: SessionSource) -> dict[str, ToolRun]:
            runs = await source.store.runs.live(session_id)
            if not runs and not await source.store.inbox.exists(session_id):
                raise self._no_session(session_id)
            return runs

        runs = await self.reads.checked(read, session_id)
        waiting = [r for r in runs.values() if r.status == "awaiting_approval"]
        return [Approval(run_id=r.run_id, task_id=r.intent.task_id, tool=r.intent.tool,
                         arguments=dict(r.intent.arguments),
                         digest=r.intent.approval_digest or "",
                         requested_ms=r.intent.created_ms)
                for r in sorted(waiting, key=lambda r: (r.intent.created_ms, r.run_id))]

    async def task(self, session_id: str, task_id: str) -> Task:
        """A task as it is now, live or finished. NotFoundError says whether the session or
        the task is missing."""
        async def read(source: SessionSource) -> Task:
            try:
                return await source.store.inbox.task(session_id, task_id)
            except NotFoundError:
                if await source.store.inbox.exists(session_id):
                    raise
                raise self._no_session(session_id) from None

        return await self.reads.checked(read, session_id)

    def _no_session(self, session_id: str) -> NotFoundError:
        return not_found(f"session {session_id}", namespace=self.store.keys.ns,
                         session_id=session_id)

    async def document(self, session_id: str, name: str, version: int | None = None,
                       ) -> Document:
        """A session's document as it is (``value``, ``version``, ``updated_ms``), or as it
        was at a ``version`` still kept. For a typed document, ``DocumentType.parse(doc.value)``
        gives its model. NotFoundError says whether the session, the document or the version
        is missing."""
        async def read(source: SessionSource) -> Document:
            return (await read_document(source.store, session_id, name, version))[0]

        return await self.reads.checked(read, session_id)

    async def wait_task(self, session_id: str, task_id: str, timeout: float = 60.0) -> Task:  # noqa: ASYNC109
        """Wait until the task is terminal; returns it."""
        return await self.reads.until(
            session_id, lambda source: source.store.inbox.task(session_id, task_id),
            lambda t: t.terminal, timeout, what=f"task {task_id} has not ended",
            why=self._why_waiting)

    async def wait(self, submission: Submission, timeout: float = 60.0) -> Submission:  # noqa: ASYNC109
        """Wait until the submission settles (completed, failed or cancelled)."""
        # While its request waits in the inbox it is not settled: nothing to decode then.
        # The first read (right after the submit, as a rule) looks at the inbox first, the
        # later ones (after a settled notification) at the submission first.
        reads = 0

        def read(source: SessionSource) -> Awaitable[Submission | None]:
            nonlocal reads
            reads += 1
            fresh = reads == 1 and not submission.settled
            return source.store.inbox.taken_up(submission, fresh=fresh)

        settled = await self.reads.until(
            submission.session_id, read, lambda s: s is not None and s.settled, timeout,
            notice=lambda message: submission_in(message, submission), announced=True,
            what=f"submission {submission.id} has not settled", why=self._why_waiting)
        assert settled is not None  # done() holds
        return settled

    async def _why_waiting(self, session_id: str) -> str:
        """What a wait that timed out most likely waits for, in words: a person's decision,
        its turn to start (fair admission), a blocked task, no live Brain for the session's
        level; else the question."""
        default = "is a Brain serving its agent running?"
        try:
            async with asyncio.timeout(WHY_READ_S):  # a hint: never long, never an error
                waiting = await self.awaiting_approval(session_id)
                if waiting:
                    return (f"{len(waiting)} tool run(s) await a decision: `baton approve "
                            f"{session_id} --run {waiting[0].run_id}` or reject")
                keys = self.store.keys
                queue = keys.admission(keys.shard_of(session_id))[3]
                ahead = await self.store.redis.zrank(queue, session_id)
                if ahead is not None:
                    return (f"it waits to start, in its shard's admission queue ({ahead} "
                            "before it): new sessions start as Brains take the ones before "
                            "(BATON_ADMISSION_WINDOW)")
                meta: dict[str, str] = await self.store.redis.hgetall(  # type: ignore[assignment]
                    self.store.keys.session(session_id).meta)  # decode_responses: str
                blocked = sorted(v for k, v in meta.items() if k.startswith("blocked:"))
                if blocked:
                    return f"blocked: {blocked[0]}"
                unserved = await self.waits(str(meta.get("agent") or ""),
                                            int(meta.get("compat") or 1), session_id=session_id)
                return unserved or default
        except Exception:  # the hint is best effort
            return default
