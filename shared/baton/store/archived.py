"""Reads that fall through to the archive: an archived session read as Redis held it.

Once a session is archived (:mod:`baton.store.retention`) its keys are gone from Redis; its
tombstone says so for ``tombstone_ttl_s``, and the archive (:class:`baton.archive.Archive`)
keeps the keys as one object. Every reader of a session (the client's reads and waits,
``baton trace``, ``inspect`` and ``watch``, the HTTP API and with it the console) finds the
session here, then reads it exactly as it reads a live one:

* :meth:`ArchivedReads.locate` says where the session's keys are, as a
  :class:`SessionSource`: the live store while Redis holds the session (its meta, or a
  request for it), else a store over the archived object
  (:meth:`Store.reading <baton.store.store.Store.reading>` of a
  :class:`~baton.archive.ArchivedKeys`, which answers redis-py's read commands as Redis
  answered them before the archival) with the session's :class:`Archival`. One round trip
  to Redis (the tombstone, meta and inbox in one MULTI). The archive is asked only when the
  tombstone names it, or when Redis has neither the session nor its tombstone (it expired):
  then once, by id, before anything says "not found".
* :meth:`ArchivedReads.read` runs a reader on Redis first and locates the session only when
  that raised NotFoundError, so reading a live session costs nothing more; the client's
  checked reads (:mod:`baton.client.reads`) do the same within their retries.

What a reader shows of an archived session is marked (:meth:`SessionSource.marker`:
``"archived": true`` and its ``"archived_ms"``; false and null for a live one). Its lease is
shown ended: the archival ended it (a restore starts past its fence). Nothing in it changes
until a new submission restores it, so a watch shows it and ends.

**Listing archived sessions** (:meth:`ArchivedReads.listing`) reads no session object. Those
archived within ``tombstone_ttl_s`` are listed from Redis: each shard's ``archived`` ZSET
(``Keys.archived``, scored by archival time; newest first, at most :data:`SCAN` ids), then
their tombstones, read a page at a time until the listing is full, whose summary holds the
agent, the newest submission's status and the creation time. Older ones, when asked for,
come from the archive's index (:meth:`Archive.list_index
<baton.archive.Archive.list_index>`, by archival hour): a day back from the tombstones'
window by default (:data:`INDEX_HOURS`), from ``since_ms`` when given, at most
:data:`~baton.archive.MAX_INDEX_HOURS` hours per listing. A row of the index whose session
is in Redis again (restored, or archived again since) is left out: the index is a hint.

**What the listing costs, and its bounds.** Per archived session, in Redis (measured as
``used_memory`` over 20,000 of them on Redis 7.0, 34-character session ids, the
five-notice session's summary): its tombstone, 1,117 bytes with its key and expiry (a
hash of nine fields; its 121-byte summary JSON is past ``hash-max-listpack-value``, 64, so
the hash is a hashtable, where the same fields each under 64 bytes would take 413 bytes as
a listpack), and its member of the shard's ``archived`` ZSET, 154 bytes (a skiplist past
128 members). About 1.3 KB per session, held for ``tombstone_ttl_s`` (a day by default)
and no longer: the tombstone expires (PEXPIRE, set by archive.lua), and each archival on a
shard drops that shard's members older than ``tombstone_ttl_s`` (ZREMRANGEBYSCORE in the
same script). Redis therefore holds (archivals per second x ``tombstone_ttl_s``) of them:
for 100,000 sessions archived a day, about 127 MB with the default day, 890 MB with 7.
In the archive: one index object per archival, about 200 bytes (zstd-compressed JSON
lines; ``archive_if_due`` writes a batch of one) in its archival hour's folder
``<namespace>/index/<YYYYMMDDHH>/``; a listing costs one LIST per hour folder it reads and
one GET per object in it. Baton deletes none of them: the index grows with the archive,
bounded by the archive's own expiry of the ``<namespace>/index/`` prefix (an S3 lifecycle
rule, or removing a local archive's old hour folders), and a listing reads at most
:data:`~baton.archive.MAX_INDEX_HOURS` folders.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError as PydanticValidationError

from baton.archive import MAX_INDEX_HOURS, Archive, ArchivedKeys, ArchivedSession, ArchiveSummary
from baton.errors import CorruptStateError, NotFoundError, from_redis_error, not_found
from baton.store.clock import now_ms
from baton.store.redis_client import REDIS_ERRORS
from baton.store.state import is_request
from baton.store.store import Store

__all__ = [
    "INDEX_HOURS", "SCAN", "Archival", "ArchivedListing", "ArchivedReads", "ArchivedRow",
    "SessionSource", "index_range_of",
]

T = TypeVar("T")

#: The most archived session ids a listing reads from the shards' archived ZSETs.
SCAN = 1_000
#: How far back from the tombstones' window a listing reads the archive's index by default.
INDEX_HOURS = 24
#: Archived sessions kept in memory once read (by id and archival): a console's page reads
#: one archived session three or four times.
CACHED = 16
_HOUR_MS = 3_600_000
#: The archive's index is read from this much before the tombstones' window ends, so a
#: clock apart from Redis' by up to this leaves no gap (the overlap is deduplicated).
_OVERLAP_MS = 60_000


@dataclass(frozen=True)
class Archival:
    """An archived session: when it was archived, its fence and commit count then, and the
    key of its object in the archive."""

    archived_ms: int
    fence: int
    seq: int
    object: str
    #: found by its tombstone in Redis (else the archive was asked by the session's id)
    tombstone: bool


@dataclass(frozen=True)
class SessionSource:
    """Where a session's keys are read: ``store`` (its ``redis``) answers the session's
    reads, the live store's, or one over its archived object when ``archival`` is set.
    ``found``: False when neither Redis nor the archive has the session."""

    store: Store
    archival: Archival | None = None
    found: bool = True

    @property
    def redis(self) -> Any:
        """What the session's keys are read with: a redis-py client, or the archived view."""
        return self.store.redis

    @property
    def archived(self) -> bool:
        return self.archival is not None

    def marker(self) -> dict[str, Any]:
        """What every view of the session carries: whether it is archived, and since when."""
        if self.archival is None:
            return {"archived": False, "archived_ms": None}
        return {"archived": True, "archived_ms": self.archival.archived_ms}


@dataclass(frozen=True)
class ArchivedRow:
    """An archived session in a listing. A row from a tombstone knows the session's compat
    level, fence, commit count and submissions; one from the archive's index does not
    (None)."""

    session_id: str
    agent: str
    #: the newest submission's status ("" when the session had none)
    status: str
    created_ms: int
    archived_ms: int
    compat: int | None = None
    fence: int | None = None
    seq: int | None = None
    submissions: int | None = None


@dataclass(frozen=True)
class ArchivedListing:
    """Archived sessions, newest archival first."""

    rows: list[ArchivedRow]
    #: how many archived sessions the shards' archived ZSETs hold in the range
    in_redis: int
    #: the archival times ``[since, until)`` read from the archive's index, if it was read
    index_range: tuple[int, int] | None = None


class ArchivedReads:
    """Finds a session in Redis or in the archive (see the module's doc); one per store.

    ``archive``: the archive, or what makes it when first needed; by default it is made from
    the store's settings (``Settings.archive_location()``) when first needed and closed by
    :meth:`close`.
    """

    def __init__(self, store: Store, archive: Archive | Callable[[], Archive] | None = None,
                 ) -> None:
        self.store = store
        self._archive = archive if isinstance(archive, Archive) else None
        self._make = archive if archive is not None and not isinstance(archive, Archive) \
            else None
        self._owned = archive is None
        self._cache: dict[tuple[str, str], ArchivedSession] = {}

    @property
    def archive(self) -> Archive:
        """The archive (made now if it was not yet)."""
        if self._archive is None:
            self._archive = self._make() if self._make is not None else Archive.from_url(
                self.store.settings.archive_location())
        return self._archive

    def on(self, store: Store) -> ArchivedReads:
        """The same archive, for the sessions ``store`` reads (another Redis credential)."""
        return ArchivedReads(store, lambda: self.archive)

    async def close(self) -> None:
        """Close the archive if this made it (idempotent)."""
        if self._owned and self._archive is not None:
            await self._archive.close()

    # ------------------------------------------------------------------ one session

    async def locate(self, session_id: str) -> SessionSource:
        """Where the session's keys are now: Redis, the archive, or nowhere (``found``
        False). The archive is asked when the tombstone names it, or when Redis has neither
        the session nor its tombstone; a tombstone whose object the archive does not hold
        is a :class:`~baton.errors.CorruptStateError`, an archive out of reach an
        :class:`~baton.errors.ArchiveUnavailable`."""
        sk = self.store.keys.session(session_id)
        redis: Any = self.store.redis  # decoded replies; redis-py's stubs say bytes | str
        try:
            async with redis.pipeline(transaction=True) as p:
                p.hgetall(sk.archived).exists(sk.meta).hkeys(sk.inbox)
                tomb, opened, requests = await p.execute()
        except REDIS_ERRORS as exc:
            raise from_redis_error(exc, session_id=session_id) from None
        # A tombstone wins over an inbox: a submission to an archived session leaves a
        # request there that asks for the restore.
        if not tomb and (opened or any(is_request(str(k)) for k in requests)):
            return SessionSource(self.store)
        archived = await self._load(session_id, tomb)
        if archived is None:
            return SessionSource(self.store, found=False)
        ns = self.store.keys.ns
        archival = Archival(
            archived_ms=_int(tomb.get("at")) or archived.archived_ms, fence=archived.fence,
            seq=archived.seq, object=tomb.get("object") or Archive.session_key(ns, session_id),
            tombstone=bool(tomb))
        return SessionSource(self.store.reading(ArchivedKeys(archived, sk)), archival)

    async def _load(self, session_id: str, tomb: dict[str, str]) -> ArchivedSession | None:
        key = (session_id, tomb.get("at", ""))
        if tomb and key in self._cache:
            return self._cache[key]
        archived = await self.archive.load(self.store.keys.ns, session_id)
        if archived is None:
            if tomb:
                raise CorruptStateError(session_id, f"its tombstone names the archive object "
                                        f"{tomb.get('object') or '?'}, which the archive at "
                                        f"{self.archive.url} does not hold")
            return None
        if tomb:  # while its tombstone is there the object is what it names
            if len(self._cache) >= CACHED:
                del self._cache[next(iter(self._cache))]  # the oldest entry
            self._cache[key] = archived
        return archived

    async def require(self, session_id: str) -> SessionSource:
        """:meth:`locate`, with NotFoundError when neither Redis nor the archive has the
        session."""
        source = await self.locate(session_id)
        if not source.found:
            raise not_found(f"session {session_id}", namespace=self.store.keys.ns,
                            session_id=session_id)
        return source

    async def read(self, session_id: str, read: Callable[[SessionSource], Awaitable[T]]) -> T:
        """``read`` of the session where it is: on Redis first; when that raises
        NotFoundError, on the archived session, or on Redis once more when the session is
        there after all (restored meanwhile); else that NotFoundError."""
        try:
            return await read(SessionSource(self.store))
        except NotFoundError:
            source = await self.locate(session_id)
            if not source.found:
                raise
        return await read(source)

    # ------------------------------------------------------------------ listings

    async def listing(self, *, since_ms: int | None = None, until_ms: int | None = None,
                      agent: str | None = None, status: str | None = None, limit: int = 50,
                      from_archive: bool = False) -> ArchivedListing:
        """Archived sessions, newest archival first, at most ``limit``: those archived in
        ``since_ms``..``until_ms`` (inclusive, when given), of ``agent``, whose newest
        submission's status is ``status``, when given. From their tombstones; with
        ``from_archive`` the archive's index fills the listing up with older ones (see the
        module's doc)."""
        redis: Any = self.store.redis
        keys = self.store.keys.every("archived")
        # A member older than the tombstones' window has no tombstone left (each shard's
        # next archival drops it).
        window = now_ms() - round(self.store.settings.tombstone_ttl_s * 1000) - _OVERLAP_MS
        top = "+inf" if until_ms is None else until_ms
        bottom = window if since_ms is None else max(since_ms, window)
        # Unfiltered, the newest ``limit`` of every shard are enough (and some to spare, for
        # the tombstones gone since); filtered, up to SCAN of them are looked through.
        num = (SCAN if agent is not None or status is not None else min(SCAN, max(limit, 100))) \
            if limit > 0 else 0
        rows: list[ArchivedRow] = []
        try:
            async with redis.pipeline(transaction=False) as p:
                for key in keys:
                    p.zrevrangebyscore(key, top, bottom, start=0, num=num, withscores=True)
                    p.zcount(key, bottom, top)
                replies = await p.execute()
            in_redis = sum(int(n) for n in replies[1::2])
            newest = sorted((pair for reply in replies[::2] for pair in reply),
                            key=lambda pair: pair[1], reverse=True)[:SCAN]
            page = max(limit, 100)
            for at in range(0, len(newest), page):  # a page of tombstones at a time
                ids = [str(sid) for sid, _ in newest[at:at + page]]
                async with redis.pipeline(transaction=False) as p:
                    for sid in ids:
                        p.hgetall(self.store.keys.session(sid).archived)
                    tombs = await p.execute()
                for sid, tomb in zip(ids, tombs, strict=True):
                    if not tomb:  # restored, or its tombstone expired
                        continue
                    row = _tombstone_row(sid, tomb)
                    if (agent is None or row.agent == agent) and (
                            status is None or row.status == status):
                        rows.append(row)
                if len(rows) >= limit:
                    break
        except REDIS_ERRORS as exc:
            raise from_redis_error(exc, namespace=self.store.keys.ns) from None
        index_range = None
        if from_archive and len(rows) < limit:
            index_range = index_range_of(since_ms, until_ms,
                                         self.store.settings.tombstone_ttl_s, now_ms())
        if index_range is not None:
            older = await self.archive.list_index(self.store.keys.ns, *index_range,
                                                  agent=agent, status=status, limit=limit)
            rows += await self._not_in_redis(older, {r.session_id for r in rows})
        return ArchivedListing(rows[:limit], in_redis, index_range)

    async def _not_in_redis(self, rows: list[Any], seen: set[str]) -> list[ArchivedRow]:
        """The index's rows whose sessions Redis holds no longer (neither their keys nor a
        tombstone): those it holds are live again, or listed from their tombstones."""
        rows = [r for r in rows if r.session_id not in seen]
        if not rows:
            return []
        redis: Any = self.store.redis
        try:
            async with redis.pipeline(transaction=False) as p:
                for r in rows:
                    sk = self.store.keys.session(r.session_id)
                    p.exists(sk.meta, sk.archived)
                held = await p.execute()
        except REDIS_ERRORS as exc:
            raise from_redis_error(exc, namespace=self.store.keys.ns) from None
        return [ArchivedRow(session_id=r.session_id, agent=r.agent, status=r.status,
                            created_ms=r.created_ms, archived_ms=r.archived_ms)
                for r, n in zip(rows, held, strict=True) if not n]


def index_range_of(since_ms: int | None, until_ms: int | None, tombstone_ttl_s: float,
                   now: int) -> tuple[int, int] | None:
    """The archival times ``[since, until)`` a listing reads from the archive's index at
    ``now``: before the tombstones' window (with an overlap), within ``since_ms`` ..
    ``until_ms`` (inclusive; :data:`INDEX_HOURS` back without ``since_ms``), at most
    :data:`~baton.archive.MAX_INDEX_HOURS` hour folders (the newest); None when that leaves
    nothing."""
    window = now - round(tombstone_ttl_s * 1000) + _OVERLAP_MS
    until = window if until_ms is None else min(window, until_ms + 1)
    since = until - INDEX_HOURS * _HOUR_MS if since_ms is None else since_ms
    since = max(since, ((until - 1) // _HOUR_MS - MAX_INDEX_HOURS + 1) * _HOUR_MS)
    return (since, until) if since < until else None


def _tombstone_row(session_id: str, tomb: dict[str, str]) -> ArchivedRow:
    """The listing's row of a tombstone (archive.lua: short fields; a tombstone written by
    an earlier version kept them in a ``summary`` JSON)."""
    try:
        summary = ArchiveSummary.model_validate_json(tomb.get("summary") or "{}")
    except PydanticValidationError:  # shown without it: the rest of the tombstone stands
        summary = ArchiveSummary()
    return ArchivedRow(
        session_id=session_id, agent=tomb.get("agent") or summary.agent,
        status=tomb.get("status") or summary.status,
        created_ms=_int(tomb.get("created")) or summary.created_ms,
        archived_ms=_int(tomb.get("at")), compat=_int(tomb.get("compat")) or summary.compat,
        fence=_int(tomb.get("fence")), seq=_int(tomb.get("seq")),
        submissions=_int(tomb.get("subs")) or summary.submissions)


def _int(value: str | None) -> int:
    return int(value) if value and value.lstrip("-").isdigit() else 0
