"""The session store on Redis: every state transition is one fenced Lua script.

``Store`` owns the session-side transitions (lease, load, commit) and the receipt queries.
It holds three collaborators that share its connection and its
:class:`~baton.store.scripts.ScriptRunner`: ``store.inbox``, the requests clients write
(:class:`~baton.store.inbox.Inbox`: submit, start, and the reads of what became of them),
``store.runs``, the tool-run transitions of Hands (:class:`~baton.store.runs.Runs`: claim,
heartbeat, complete), and ``store.decisions``, the operator decisions
(:class:`~baton.store.control.Decisions`: cancel, approve, reject). The types it returns and
the parsers live in :mod:`baton.store.state`. The relay's outbox and timer operations live
in :mod:`baton.store.outbox`; connections come from :mod:`baton.store.redis_client`. Each
method is one round trip.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, cast

from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, NoPermissionError

from baton.errors import (
    BatonError,
    RedisUnavailable,
    from_redis_error,
)
from baton.models import (
    Entry,
    Submission,
    Task,
    WorkerRef,
    decode,
    dumps,
)
from baton.observability.log import get_logger
from baton.observability.tracing import (
    counted_refusals,
    traced_commit,
    traced_lease,
    traced_recheck,
)
from baton.receipts import Carrier, Receipt
from baton.settings import Settings
from baton.store.batch import ScriptBatch
from baton.store.clock import StoreClock, now_ms
from baton.store.control import Decisions
from baton.store.entry_cache import CachedEntries, EntryCache
from baton.store.inbox import Inbox
from baton.store.keys import Keys
from baton.store.loading import (
    as_native_reads,
    as_pipeline_reads,
    lease_reads,
    missing_submissions,
    queue_load,
    session_state,
    tail_is_read,
)
from baton.store.redis_client import (
    REDIS_ERRORS,
    connect_redis,
    redis_user,
    run_batch,
    without_password,
)
from baton.store.runs import Runs, worker_json
from baton.store.scripts import ScriptRunner
from baton.store.state import (
    Claim,
    Lease,
    Partial,
    SessionState,
    merge_receipts,
    parse_partial,
    receipts_about,
)
from baton.store.writes import Writes

#: A Brain commit's bound, in multiples of ``max_payload_bytes`` (see :meth:`Store.commit`).
COMMIT_PAYLOAD_FACTOR = 3


def _carrier_arg(carrier: Carrier | None) -> str:
    return carrier.model_dump_json() if carrier is not None else ""


log = get_logger("baton.store")


@dataclass(frozen=True)
class HoldEnd:
    """A release that ends a hold (baton.brain.held): who held, for how long, and whether
    the results' signal came (else the hold ran its length). ``heard`` keeps the name of
    the ``held`` receipt's JSON field it is written to."""

    worker: WorkerRef
    heard: bool
    hold_ms: int


def _hold_end_args(end: HoldEnd | None) -> list[str]:
    """release.lua's ARGV 3 and 4 for a release that ends a hold: its receipt's."""
    if end is None:
        return []
    return [worker_json(end.worker),
            f'{{"heard":{"true" if end.heard else "false"},"hold_ms":{end.hold_ms}}}']


def worker_ref(role: str, name: str) -> WorkerRef:
    return WorkerRef(role=role, name=name, pid=os.getpid())


class Renewal(NamedTuple):
    """A renewed lease: its new expiry (ms), and the targets (task ids, ``*``) of the cancel
    requests waiting in the session's inbox."""

    expiry_ms: int
    cancels: frozenset[str]


class Release(enum.IntEnum):
    """What the last commit of a pass did with the lease (commit.lua's third reply)."""

    RELEASED = 0
    KEPT = 1  # work arrived meanwhile: load and recheck
    HELD = 2  # kept for the results of the runs in flight (Writes.hold_as, brain.held)


class Store:
    """Session transitions, with the tool-run transitions as ``runs`` and the operator
    decisions as ``decisions``. One instance per process; safe for concurrent use."""

    def __init__(self, redis: Redis, settings: Settings, *,
                 entry_cache: EntryCache | None = None,
                 scripts: ScriptRunner | None = None) -> None:
        self.redis = redis
        self.settings = settings
        #: The newest entries of the sessions this store leased lately (a Brain's): a lease
        #: reads only the entries appended since (:mod:`baton.store.entry_cache`).
        self.entry_cache = entry_cache
        self.keys = Keys(settings.namespace, settings.shards)
        self.scripts = scripts or ScriptRunner(redis, settings)
        self.inbox = Inbox(redis, self.keys, settings, self.scripts)
        #: The scripts issued in one event-loop turn (leases, commits, releases, and the
        #: Hands' claims and completions through ``runs``) go in one round trip.
        self.batch = ScriptBatch(self.scripts)
        self.runs = Runs(redis, self.keys, settings, self.scripts, self.batch)
        self.decisions = Decisions(self.keys, settings, self.scripts, self.runs)
        #: Redis' clock as this process knows it (a Brain keeps it measured: see
        #: :class:`~baton.store.clock.StoreClock`); timers are due on it.
        self.clock = StoreClock()
        #: Awaited after a commit that armed a timer or a deadline (a Brain's timer notification
        #: to the relays, :class:`baton.bus.timer_notify.TimerNotifier`); None: nobody to tell.
        self.timers_armed: Callable[[], Awaitable[None]] | None = None

    @classmethod
    async def connect(cls, settings: Settings, *,
                      entry_cache: EntryCache | None = None) -> Store:
        """Connect and check the server answers; ``RedisUnavailable`` within the timeout."""
        redis = connect_redis(settings)
        store = cls(redis, settings, entry_cache=entry_cache)
        try:
            await redis.ping()
        except (AuthenticationError, NoPermissionError) as exc:
            await redis.aclose()
            raise from_redis_error(exc, role=redis_user(settings)) from None
        except REDIS_ERRORS as exc:
            await redis.aclose()
            url = without_password(settings.redis_url)
            raise RedisUnavailable(f"cannot reach Redis at {url}: {exc}", url=url) from None
        return store

    async def close(self) -> None:
        await self.redis.aclose()

    def reading(self, redis: Any) -> Store:
        """This store with its reads answered by ``redis`` instead: an archived session's
        :class:`~baton.archive.ArchivedKeys` (:mod:`baton.store.archived`), so that every
        reader of a store reads the archived session as it read it in Redis. Keys, settings
        and scripts are this store's: a script run through it goes to Redis, where an archived
        session refuses it. Not to be closed (it holds no connection of its own)."""
        return Store(redis, self.settings, scripts=self.scripts)

    # ------------------------------------------------------------------ Brain side

    async def acquire(
        self, session_id: str, worker: WorkerRef, ttl_ms: int, *, carrier: Carrier | None = None
    ) -> Lease:
        """Take the lease: ``LeaseBusyError`` while another live worker holds it.

        ``carrier`` (how the wake that caused this arrived) is saved in the lease receipt.
        """
        sk = self.keys.session(session_id)
        fence, prev, takeover = await self.scripts.run(
            "acquire", sk, [worker.name, ttl_ms, worker.model_dump_json(), _carrier_arg(carrier)]
        )
        return Lease(session_id, int(fence), bool(takeover), prev or "")

    @counted_refusals("renew")
    async def renew(
        self, session_id: str, fence: int, ttl_ms: int, worker: WorkerRef | None = None
    ) -> Renewal:
        """Extend the lease; a stale holder gets ``StaleFenceError`` (and a receipt says so).
        The answer names the targets of the cancel requests waiting in the session's inbox."""
        args: list[Any] = [fence, ttl_ms]
        if worker is not None:
            args.append(worker.model_dump_json())
        reply = await self.scripts.run("renew", self.keys.session(session_id), args)
        return Renewal(int(reply[0]), frozenset(str(t) for t in reply[1] or ()))

    async def release(self, session_id: str, fence: int, ttl_ms: int, *,
                      hold_end: HoldEnd | None = None) -> bool:
        """Release the lease; True means work arrived meanwhile and the lease is kept.
        ``hold_end``: the release ends a hold (baton.brain.held), recorded by a ``held``
        receipt when the lease is kept."""
        sk = self.keys.session(session_id)
        args = [fence, ttl_ms, *_hold_end_args(hold_end)]
        return bool(await self.scripts.run("release", sk, args))

    async def hand_over(self, session_id: str, fence: int) -> None:
        """Release the lease of a pass stopped midway (its Brain stopping), whatever arrived
        meanwhile, and mark the session handed over by ``fence``: the Brain that takes it
        over next leases it at once and re-enters the interrupted phase without counting a
        crash (release.lua's handover)."""
        sk = self.keys.session(session_id)
        await self.scripts.run("release", sk, [fence, self.settings.lease_ms, "", "", 1])

    @traced_recheck
    async def release_and_load(
        self, session_id: str, fence: int, ttl_ms: int, *, hold_end: HoldEnd | None = None,
        read_ahead: bool = True,
    ) -> SessionState | None:
        """:meth:`release`, and when work arrived meanwhile (the lease kept for a recheck)
        the state that recheck needs; None when the lease was released.

        On one server the state is read by plain commands sent right after release.lua in
        the same round trip, as after a lease (:func:`~baton.store.loading.lease_reads`):
        when the release kept the lease, they read what a lease's reads would; when it
        released it, they are dropped. Elsewhere, and with ``read_ahead=False`` (a hold
        that ran its length without a signal, whose results are most often not in yet: reads
        sent with a release that drops the lease would be wasted), :meth:`release` then,
        when it kept the lease, :meth:`reload_under_lease`.
        """
        if not read_ahead or not self._reads_plainly("release"):
            if not await self.release(session_id, fence, ttl_ms, hold_end=hold_end):
                return None
            return await self.reload_under_lease(session_id)
        page = self.settings.entries_page
        cached, reads = self._plain_reads(session_id, page)
        args = [fence, ttl_ms, *_hold_end_args(hold_end)]
        kept, replies = await self.batch.run_and_read(
            "release", self.keys.session(session_id), args, reads)
        if not kept:
            return None
        return await self._state_from_reads(session_id, as_native_reads(replies), page, cached)

    async def reload_under_lease(self, session_id: str) -> SessionState:
        """The state re-read by the lease holder after a commit or release that kept its
        lease (and cleared the nudge) for a recheck: on one server by the plain reads of a
        lease (:func:`~baton.store.loading.lease_reads`, what only the holder writes cannot
        change under them), in one round trip without a transaction; else :meth:`load`."""
        if not self._reads_plainly("release"):
            return await self.load(session_id)
        page = self.settings.entries_page
        cached, reads = self._plain_reads(session_id, page)
        try:
            replies = await run_batch(self.redis, reads)
        except REDIS_ERRORS as exc:
            raise from_redis_error(
                exc, session_id=session_id, role=redis_user(self.settings)) from None
        return await self._state_from_reads(session_id, as_native_reads(replies), page, cached)

    def _reads_plainly(self, script: str) -> bool:
        """Whether the state after ``script`` (a lease, or a release that kept it) is read
        by plain commands (:func:`~baton.store.loading.lease_reads`): on one server, by a
        pooled client, when the script waits for no replica."""
        return self.batch.reads_natively and not self.scripts.replicated(script)

    def _cached_entries(self, session_id: str) -> CachedEntries | None:
        """The session's entries this Brain cached from its earlier leases, if any."""
        return self.entry_cache.get(session_id) if self.entry_cache is not None else None

    def _plain_reads(
        self, session_id: str, page: int
    ) -> tuple[CachedEntries | None, list[tuple[Any, ...]]]:
        """The cached entries and the plain reads of the state after them."""
        cached = self._cached_entries(session_id)
        return cached, lease_reads(self.keys.session(session_id), page,
                                 cached.end if cached else None)

    async def _state_from_reads(self, session_id: str, reads: list[Any], page: int,
                          cached: CachedEntries | None) -> SessionState:
        """The state of a lease's plain reads. When the entries read from where ``cached``
        ends are not the cached entries' continuation, the newest page is read instead, as
        acquire.lua would read it: the lease is ours, so no entry is appended meanwhile."""
        if cached is not None and not tail_is_read(reads, page, cached.end, cached.created):
            reads[5] = await self.redis.lrange(self.keys.session(session_id).entries, -page, -1)
        return await self._state(session_id, reads, page)

    async def load(self, session_id: str, *, page: int | None = None) -> SessionState:
        """A consistent snapshot of the live state and the newest page of entries."""
        sk = self.keys.session(session_id)
        try:
            async with self.redis.pipeline(transaction=True) as p:
                queue_load(p, sk, page or self.settings.entries_page)
                results = await p.execute()
        except REDIS_ERRORS as exc:
            raise from_redis_error(
                exc, session_id=session_id, role=redis_user(self.settings)
            ) from None
        return await self._state(session_id, results)

    @traced_lease
    async def acquire_and_load(
        self, session_id: str, worker: WorkerRef, ttl_ms: int, *, page: int | None = None,
        carrier: Carrier | None = None,
    ) -> tuple[Lease, SessionState]:
        """Take the lease and load the state in one round trip.

        On one server the state is read by plain commands sent right after the acquire
        script (see :func:`~baton.store.loading.lease_reads`); on a cluster (or a client of
        one connection) by the script itself (atomically), or, when the acquire waits for a
        replica, right after the ``WAIT`` (see :meth:`ScriptRunner.run_and_read`). Either
        way the state holds everything the new fence holder may build on: what only the
        holder writes cannot change after its lease, and what others write meanwhile also
        leaves the nudge.
        """
        sk = self.keys.session(session_id)
        args = [worker.name, ttl_ms, worker_json(worker), _carrier_arg(carrier)]
        if self._reads_plainly("acquire"):
            # On one server the script takes the lease and plain commands sent right after
            # it read the state, in the same round trip (see loading.lease_reads).
            page = page or self.settings.entries_page
            cached, reads = self._plain_reads(session_id, page)
            (fence, prev, takeover), replies = await self.batch.run_and_read(
                "acquire", sk, [*args, -1], reads)
            lease = Lease(session_id, int(fence), bool(takeover), prev or "")
            return lease, await self._state_from_reads(session_id, as_native_reads(replies), page,
                                                 cached)
        if not self.scripts.replicated("acquire"):
            # A cluster: the script reads the state itself (one command, no MULTI/EXEC
            # around it); a replicated acquire records its reply for a retry, so it reads
            # after the WAIT.
            # With cached entries it reads only the entries appended since.
            page = page or self.settings.entries_page
            cached = self._cached_entries(session_id)
            fence, prev, takeover, state = await self.batch.run(
                "acquire", sk, [*args, page, *((cached.end, cached.created) if cached else (0, 0))])
            lease = Lease(session_id, int(fence), bool(takeover), prev or "")
            return lease, await self._state(session_id, as_pipeline_reads(state), page)
        reply, reads = await self.scripts.run_and_read(
            "acquire", sk, args,
            lambda p: queue_load(p, sk, page or self.settings.entries_page))
        fence, prev, takeover = reply
        lease = Lease(session_id, int(fence), bool(takeover), prev or "")
        return lease, await self._state(session_id, reads)

    async def _state(self, session_id: str, results: list[Any], page: int = 0) -> SessionState:
        """:func:`~baton.store.loading.session_state` of a load's reads; ``page``: they are
        acquire.lua's for what the entry cache held. A live task's submission that meta
        does not hold (a session a Brain of an earlier version committed: see
        :func:`~baton.store.loading.missing_submissions`) is read from the subs hash."""
        state = session_state(session_id, results, namespace=self.settings.namespace,
                              role=redis_user(self.settings), cache=self.entry_cache, page=page)
        missing = missing_submissions(state)
        if missing:
            try:
                raw = await self.redis.hmget(self.keys.session(session_id).subs, missing)
            except REDIS_ERRORS as exc:
                raise from_redis_error(
                    exc, session_id=session_id, role=redis_user(self.settings)) from None
            for v in raw:
                if v is not None:
                    sub = decode(Submission, v)
                    state.submissions[sub.id] = sub
        return state

    async def entries(self, session_id: str, start: int = 0, stop: int = -1) -> list[Entry]:
        """Entries ``start..stop`` (inclusive, Redis LRANGE semantics)."""
        raw = await self.redis.lrange(self.keys.session(session_id).entries, start, stop)
        return [decode(Entry, e) for e in raw]

    @traced_commit
    async def commit(
        self, session_id: str, fence: int, writes: Writes, worker: WorkerRef
    ) -> tuple[int, int]:
        """Apply a write-set atomically under the fence; returns (seq, entry count)."""
        reply = await self._commit(session_id, fence, writes, worker)
        return int(reply[0]), int(reply[1])

    @traced_commit
    async def commit_and_release(
        self, session_id: str, fence: int, writes: Writes, worker: WorkerRef
    ) -> tuple[int, int, Release]:
        """:meth:`commit` as the last of a pass (``writes.release_ttl_ms`` > 0), releasing
        the lease in the same script as :meth:`release` would, or holding it
        (``writes.hold_as``): returns (seq, entry count, what became of the lease)."""
        if writes.release_ttl_ms <= 0:
            raise ValueError("commit_and_release needs writes.release_ttl_ms > 0")
        seq, count, outcome = await self._commit(session_id, fence, writes, worker)
        return int(seq), int(count), Release(int(outcome))

    async def _commit(
        self, session_id: str, fence: int, writes: Writes, worker: WorkerRef
    ) -> Any:
        """commit.lua's reply for ``writes``; then the relays are told (``timers_armed``)
        when the commit armed a timer or a deadline.

        Its notifications (``writes.notify``: a settled submission's message to the clients
        waiting for it, which they answer from without reading the store) are SPUBLISHed
        by the script itself on one server, in the commit's one round trip. When commits
        wait for a replica (a cluster) they are published only after the replica
        acknowledged the commit: published by the script, a client could hold an answer
        that a failover then loses. A commit in doubt publishes nothing; its retry does."""
        notify: list[tuple[str, str]] = []
        if writes.notify and self.scripts.replicated("commit"):
            notify, writes = writes.notify, replace(writes, notify=[])
        args = writes.to_script()
        # A commit may carry a record that embeds an input accepted up to the limit (the
        # submission, rewritten as it runs and settles) beside the Brain's own output of
        # the same bound, and the commit taking a request up carries its text twice (the
        # entry and the submission) with its task: three times the input limit, so a
        # submission at the limit completes.
        self.scripts.check_size(args, "commit", times=COMMIT_PAYLOAD_FACTOR)
        reply = await self.batch.run("commit", self.keys.session(session_id),
                                          [fence, worker_json(worker), session_id, *args])
        for channel, message in notify:  # acknowledged by the replica: now they may hear
            try:
                await self.redis.spublish(channel, message)
            except REDIS_ERRORS as exc:  # the waiters' periodic re-read finds the answer
                log.warning("settled_notice_unsent", session_id=session_id,
                            error=str(exc)[:200])
        if self.timers_armed is not None and (writes.timers_add or writes.deadline_ms > 0):
            await self.timers_armed()
        return reply

    async def save_partial(
        self, session_id: str, fence: int, worker: WorkerRef, *, task_id: str,
        request_id: str, offset: int, delta: str, chars: int, at_ms: int = 0,
    ) -> int | None:
        """Append ``delta`` to a streaming answer's saved text (partial.lua), where the saved
        text ends at ``offset`` bytes (UTF-8); ``chars``: the text's length with it.

        Returns the saved text's length in bytes after the call: ``offset`` plus the
        delta's bytes when it was appended, else (the saved text does not end at ``offset``:
        a retried or overtaken save) where it ends, for the caller to send the text from
        there; None when the fence is stale (nothing written). Each save writes only its
        delta, so a streamed text costs bytes linear in its length.

        ``at_ms``: when the Brain sent this save, in ms since the stream began (its
        throttle's clock), kept in the receipt as ``stream_ms``.

        Losable by design: the caller drops a failure; the next commit clears the text.
        """
        sk = self.keys.session(session_id)
        receipt = dumps({"detail": {"task_id": task_id, "request_id": request_id,
                                    "delta": delta, "chars": chars, "stream_ms": at_ms}})
        saved = int(await self.scripts.run(
            "partial", sk, [fence, worker.model_dump_json(), task_id, request_id, offset,
                            delta, receipt]))
        return None if saved < 0 else saved

    async def partial(self, session_id: str) -> Partial | None:
        """The streamed text saved since the last commit, if any."""
        meta = await self.redis.hgetall(self.keys.session(session_id).meta)
        return parse_partial(cast(dict[str, str], meta))  # decoded replies, as above

    # ------------------------------------------------------------------ history

    async def finished_tasks(self, session_id: str) -> dict[str, Task]:
        raw = cast(dict[str, str], await self.redis.hgetall(self.keys.session(session_id).done))
        return {k: decode(Task, v) for k, v in raw.items()}

    async def receipts(
        self, session_id: str, after: str = "-", count: int = 10_000
    ) -> list[Receipt]:
        """The session's receipts after receipt id ``after``, at most ``count``: every role's
        stream merged in order, each receipt attributed to its stream's role
        (:func:`~baton.store.state.merge_receipts`)."""
        start = after if after == "-" else f"({after}"
        streams = self.keys.session(session_id).receipt_streams()
        async with self.redis.pipeline(transaction=False) as p:
            for _, key in streams:
                p.xrange(key, start, "+", count)
            replies = await p.execute()
        raw = cast(list[list[tuple[str, dict[str, str]]]], replies)  # decoded replies
        # Each stream gave its first ``count``: the merged first ``count`` are then complete.
        return merge_receipts(zip((role for role, _ in streams), raw, strict=True))[:count]

    async def receipts_for(
        self, session_id: str, *, task_id: str | None = None, run_id: str | None = None
    ) -> list[Receipt]:
        """The session's receipts about one task (its commits and its runs) and/or one run."""
        return receipts_about(await self.receipts(session_id), task_id=task_id, run_id=run_id)


__all__ = [
    "COMMIT_PAYLOAD_FACTOR", "BatonError", "Claim", "HoldEnd", "Lease", "Partial", "Release",
    "SessionState", "Store",
    "connect_redis", "now_ms",
    "receipts_about",
]
