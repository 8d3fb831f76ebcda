"""The archive: settled sessions kept as one compressed object each, outside Redis.

Redis holds live work only (DESIGN.md section 12): once a settled session's retention has
passed it is written here and removed from Redis (:mod:`baton.store.retention` does the
fenced transition; this module owns the object, the stores and the reads from an object).

**The object.** :class:`ArchivedSession` holds the session's keys as Redis held them, by key
family (:mod:`baton.store.keys`): the hashes ``meta tasks done docs subs reqs runs runs_done
intents inbox poison`` as field -> value, ``entries`` as the list, each role's receipts
stream (``receipts``, ``receipts_hands``, ``receipts_client``) as ``(stream id, fields)``
pairs (an object written before per-role streams has every receipt in ``receipts``, and
reads and restores as it was), the ``nudge`` string (None when unset), plus the namespace,
the session id, when it was archived, meta's ``seq`` and the fence at archival, and a
:class:`ArchiveSummary` for listings. The idempotency records (``applied``,
``runs_applied``, ``inbox_applied``) are not kept: they expire anyway. :func:`snapshot` reads
them all in one MULTI. :func:`encode` writes the model as JSON (orjson), then compresses it
with zstandard at level 3; :func:`decode` refuses, as a
:class:`~baton.errors.CorruptStateError`, an object that is not a zstandard frame, holds
more than :data:`MAX_OBJECT_BYTES` once decompressed, is not JSON, is of another schema
version than :data:`ARCHIVE_VERSION`, or does not validate.

**Costs, measured** (five-notice sessions of the bundled example run in one process on real
servers, then snapshot; 5 sessions each, a 2-core machine, CPU time per session)::

    session                     JSON       zstd-3 (ratio)   zlib-6 (ratio)   in Redis
    one turn                    27.5 KB    2.8 KB  (9.8x)   2.7 KB (10.1x)   31.9 KB
    two turns                   32.2 KB    3.4 KB  (9.4x)   3.3 KB  (9.8x)   38.3 KB
    ten turns                  155.3 KB    9.9 KB (15.6x)  11.3 KB (13.7x)  161.0 KB

    compress, one / ten turns:    zstd-1 20 / 82 us, zstd-3 25 / 91 us, zstd-9 146 / 918 us,
                                  zstd-19 9.5 / 66 ms; zlib-1 47 / 379 us, zlib-6 189 /
                                  1023 us, zlib-9 318 / 2852 us
    decompress, one / ten turns:  zstd 8 / 31 us; zlib 23-25 / 128-174 us

zstandard level 3 compresses 7-11x faster than zlib's default level for the same size
(within 4% on a one-turn session, 12% smaller on ten turns) and decompresses 3-5x faster;
levels above 3 buy 5-10% for 4-700x the CPU. The ten-turn figures flatter every codec (the
scripted model repeats its text); a real model's text compresses less. With the model's
dump and validation, :func:`encode` costs 62 us and :func:`decode` 48 us for a one-turn
session, 317 and 261 us for ten turns.

**The stores** (:class:`Archive`, through obstore: one Rust library for a local directory,
S3-compatible stores, GCS and Azure, async, with its own retries). ``Archive.from_url``
takes a local directory (a plain path or ``file:///abs/path``, created if missing: the
embedded default), ``s3://bucket/prefix`` (credentials, region and endpoint from the
standard ``AWS_*`` environment variables obstore reads: ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ALLOW_HTTP`` for a
local http endpoint), ``gs://`` and ``az://`` likewise (untested here), and ``memory:///``
(a process's own, for tests). Layout under the URL's prefix::

    <namespace>/sessions/<session id>.json.zst                 one object per session
    <namespace>/index/<YYYYMMDDHH>/<archived ms>-<random>.jsonl.zst
                                                               one object per batch of rows

A write returns once the store confirmed it (a local file is fsync'd with its folder); a
session's object is overwritten by a later archival of it. Every call has a deadline
(``timeout_s``, 30 s by default, obstore's retries within it). A store that cannot be
reached or fails (a timeout, a refused connection, a 5xx) is an :class:`ArchiveUnavailable`
(retryable); one that refuses (denied, unauthenticated, no such bucket, another 4xx) an
:class:`ArchiveError` (terminal). Both name the archive's URL without credentials or query.

**The index** (:meth:`Archive.put_index`, :meth:`Archive.list_index`) lists archived
sessions without scanning the archive: a batch of :class:`IndexRow` (session id, agent,
status, created and archived ms; 135 bytes of JSON a row, 19 once compressed in a batch of
100: a 1.9 KB object) is one object in the folder of its archival hour (UTC; a batch spanning hours
is one object per hour). A listing reads only the hour folders of its range, newest first:
one LIST per hour and one GET per batch object in it, and stops after the hour in which the
limit was reached. Per session that is 1/batch of a PUT to write and 1/batch of a GET to
list. A session archived twice (restored meanwhile) has a row per archival; a listing keeps
its newest. The index is a hint: a listed session may have been restored or deleted since,
so a reader looks the session up before it trusts the row.

**Reads from an object** (:class:`ArchivedKeys`): the read commands Baton's readers send
for a session's keys (HGETALL, LRANGE, XRANGE, ... and pipelines of them), answered from the
object with redis-py's reply shapes, so a reader falls through to the archive by reading the
view instead of Redis. Writes to it raise :class:`ArchivedError`.

**Bounds.** An object holds one session; :func:`decode` refuses one past
:data:`MAX_OBJECT_BYTES` decompressed. An index listing spans at most
:data:`MAX_INDEX_HOURS` hours and returns at most ``limit`` rows; it reads at most
:data:`INDEX_READS` objects at once. Namespaces are ``[a-z][a-z0-9_-]{0,31}`` (as
:class:`~baton.settings.Settings` has them) and session ids ``[A-Za-z0-9_.:-]{1,128}``, so
a key never leaves its folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn
from urllib.parse import unquote, urlsplit

import orjson
import zstandard
from pydantic import BaseModel, ConfigDict
from pydantic import ValidationError as PydanticValidationError
from redis.exceptions import DataError, ResponseError

from baton.errors import (
    ArchivedError,
    ArchiveError,
    ArchiveUnavailable,
    ConfigError,
    CorruptStateError,
    ValidationError,
    from_redis_error,
)
from baton.store.keys import SessionKeys, check_session_id
from baton.store.redis_client import REDIS_ERRORS

if TYPE_CHECKING:
    from obstore.store import ObjectStore

__all__ = [
    "ARCHIVE_VERSION",
    "Archive",
    "ArchiveError",
    "ArchiveSummary",
    "ArchiveUnavailable",
    "ArchivedError",
    "ArchivedKeys",
    "ArchivedSession",
    "IndexRow",
    "decode",
    "encode",
    "snapshot",
]

#: The schema version of :class:`ArchivedSession` this version of Baton writes and reads.
ARCHIVE_VERSION: Literal[1] = 1
#: The codec's name, as the objects' names end.
EXTENSION = "zst"
#: zstandard's level: see the module's figures.
LEVEL = 3
#: The most bytes an object may hold once decompressed (a bomb is refused, not allocated).
MAX_OBJECT_BYTES = 256 * 1024 * 1024
#: The longest range :meth:`Archive.list_index` reads: a month of hour folders.
MAX_INDEX_HOURS = 24 * 31
#: How many index objects a listing reads at once.
INDEX_READS = 16
#: Every call to a store ends within this many seconds unless told otherwise.
TIMEOUT_S = 30.0

NAMESPACE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_HOUR_MS = 3_600_000
_STREAM_ID = re.compile(r"^(\d+)(?:-(\d+))?$")
_MAX_ID_PART = 2**64 - 1
_HASH_FAMILIES = ("meta", "tasks", "done", "docs", "subs", "reqs", "runs", "runs_done",
                  "intents", "inbox", "poison")


# ------------------------------------------------------------------------------ errors
# Placeholders until baton.errors has the archive's classes: ArchiveError and
# ArchiveUnavailable belong in its tree (under BatonError, and under UnavailableError for
# the retryable one), and ArchivedError is being added there with this signature; the view
# raises this one meanwhile.


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ArchiveSummary(_Frozen):
    """What a listing shows of an archived session without reading its object."""

    agent: str = ""
    compat: int = 0
    #: the status of the newest submission ("" when it has none)
    status: str = ""
    created_ms: int = 0
    #: when the newest submission settled (None: it has not, or there is none)
    settled_ms: int | None = None
    submissions: int = 0


class ArchivedSession(_Frozen):
    """One session's keys as Redis held them when it was archived (see the module's doc)."""

    v: Literal[1] = ARCHIVE_VERSION
    namespace: str
    session_id: str
    archived_ms: int
    #: meta's seq at archival: the commit count a restore continues from
    seq: int
    #: the fence of the lease under which it was archived
    fence: int
    summary: ArchiveSummary
    meta: dict[str, str] = {}
    entries: list[str] = []
    tasks: dict[str, str] = {}
    done: dict[str, str] = {}
    docs: dict[str, str] = {}
    subs: dict[str, str] = {}
    reqs: dict[str, str] = {}
    runs: dict[str, str] = {}
    runs_done: dict[str, str] = {}
    intents: dict[str, str] = {}
    inbox: dict[str, str] = {}
    poison: dict[str, str] = {}
    receipts: list[tuple[str, dict[str, str]]] = []
    receipts_hands: list[tuple[str, dict[str, str]]] = []
    receipts_client: list[tuple[str, dict[str, str]]] = []
    nudge: str | None = None

    def last_receipts(self) -> str:
        """The id of the last receipt of each role's stream, space-separated ('' for
        none), as archive.lua compares them."""
        return " ".join(stream[-1][0] if stream else ""
                        for stream in (self.receipts, self.receipts_hands,
                                       self.receipts_client))


class IndexRow(_Frozen):
    """One archived session in the index (:meth:`Archive.put_index`)."""

    v: Literal[1] = 1
    session_id: str
    agent: str
    status: str
    created_ms: int
    archived_ms: int

    @classmethod
    def of(cls, archived: ArchivedSession) -> IndexRow:
        """The row of an archived session."""
        s = archived.summary
        return cls(session_id=archived.session_id, agent=s.agent, status=s.status,
                   created_ms=s.created_ms, archived_ms=archived.archived_ms)


_COMPRESSOR = zstandard.ZstdCompressor(level=LEVEL)
_DECOMPRESSOR = zstandard.ZstdDecompressor()


def _compress(raw: bytes) -> bytes:
    return _COMPRESSOR.compress(raw)


def _decompress(data: bytes, what: str) -> bytes:
    try:
        size = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise CorruptStateError(what, f"archive object is not a zstandard frame: {exc}") \
            from None
    if size > MAX_OBJECT_BYTES:
        raise CorruptStateError(what, f"archive object of {size} bytes decompressed, past "
                                f"the bound of {MAX_OBJECT_BYTES}")
    try:
        # A frame that states its size is decompressed into that; one that does not, into
        # at most the bound.
        return _DECOMPRESSOR.decompress(data, max_output_size=MAX_OBJECT_BYTES)
    except zstandard.ZstdError as exc:
        bound = "" if size >= 0 else f" of at most {MAX_OBJECT_BYTES} bytes"
        raise CorruptStateError(what, f"archive object is not a whole zstandard frame"
                                f"{bound}: {exc}") from None


def encode(archived: ArchivedSession) -> bytes:
    """The object's bytes: the model as JSON, compressed."""
    return _compress(orjson.dumps(archived.model_dump(mode="json")))


def decode(data: bytes | bytearray | memoryview) -> ArchivedSession:
    """The session an object holds; :class:`~baton.errors.CorruptStateError` when it is not
    one this version of Baton reads (see the module's doc)."""
    raw = _decompress(bytes(data), "")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise CorruptStateError("", f"archive object is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise CorruptStateError("", "archive object is not a JSON object")
    sid = str(doc.get("session_id", ""))[:128]
    if doc.get("v") != ARCHIVE_VERSION:
        raise CorruptStateError(sid, f"archive object has schema version {doc.get('v')!r}; "
                                f"this version of Baton reads version {ARCHIVE_VERSION}")
    try:
        return ArchivedSession.model_validate(doc)
    except PydanticValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise CorruptStateError(sid, f"archive object does not validate ({exc.error_count()} "
                                f"error(s); {where}: {first['msg']})") from None


def _summary(meta: dict[str, str], subs: dict[str, str]) -> ArchiveSummary:
    """The listing's summary: meta's agent and compat, the newest submission's status.
    Records that do not parse are left out of it (the object keeps them as they are)."""
    parsed = []
    for raw in subs.values():
        with contextlib.suppress(orjson.JSONDecodeError):
            sub = orjson.loads(raw)
            if isinstance(sub, dict):
                parsed.append(sub)

    def created(sub: dict[str, Any]) -> tuple[int, str]:
        ms = sub.get("created_ms")
        return (ms if isinstance(ms, int) else 0, str(sub.get("id", "")))

    newest = max(parsed, key=created, default={})
    settled = newest.get("settled_ms")
    return ArchiveSummary(
        agent=meta.get("agent") or str(newest.get("agent", "")),
        compat=_int(meta.get("compat")),
        status=str(newest.get("status", "")),
        created_ms=_int(meta.get("created")) or min((created(s)[0] for s in parsed),
                                                    default=0),
        settled_ms=settled if isinstance(settled, int) else None,
        submissions=len(subs),
    )


def _int(value: str | None) -> int:
    return int(value) if value and value.lstrip("-").isdigit() else 0


async def snapshot(redis: Any, keys: SessionKeys, *, namespace: str | None = None,
                   fence: int | None = None, archived_ms: int | None = None
                   ) -> ArchivedSession:
    """The session's keys as they are now, read in one MULTI (an HGETALL per hash,
    ``LRANGE 0 -1`` of the entries, ``XRANGE - +`` of each role's receipts stream, a GET of
    the nudge) on ``redis``, a client with ``decode_responses`` (Baton's). ``namespace``
    defaults to the keys' own, ``fence`` to meta's, ``archived_ms`` to now."""
    hashes = [getattr(keys, family) for family in _HASH_FAMILIES]
    try:
        async with redis.pipeline(transaction=True) as p:
            for key in hashes:
                p.hgetall(key)
            p.lrange(keys.entries, 0, -1)
            for _, stream in keys.receipt_streams():
                p.xrange(stream, "-", "+")
            p.get(keys.nudge)
            replies = await p.execute()
    except REDIS_ERRORS as exc:
        raise from_redis_error(exc, session_id=keys.session_id) from None
    families = dict(zip(_HASH_FAMILIES, replies, strict=False))
    meta = families["meta"]
    for name in ("seq", "fence"):
        if meta.get(name) is not None and not str(meta[name]).isdigit():
            raise CorruptStateError(keys.session_id, f"meta {name} is not an integer: "
                                    f"{str(meta[name])[:40]!r}")
    entries, receipts, receipts_hands, receipts_client, nudge = replies[len(_HASH_FAMILIES):]
    return ArchivedSession(
        namespace=namespace or keys.meta.partition(":")[0],
        session_id=keys.session_id,
        archived_ms=archived_ms if archived_ms is not None else time.time_ns() // 1_000_000,
        seq=_int(meta.get("seq")),
        fence=fence if fence is not None else _int(meta.get("fence")),
        summary=_summary(meta, families["subs"]),
        entries=entries,
        receipts=[(rid, fields) for rid, fields in receipts],
        receipts_hands=[(rid, fields) for rid, fields in receipts_hands],
        receipts_client=[(rid, fields) for rid, fields in receipts_client],
        nudge=nudge,
        **families,
    )


# ------------------------------------------------------------------------------ the stores


def _redact(url: str) -> str:
    """``url`` without user, password, query or fragment."""
    parts = urlsplit(url)
    if not parts.scheme or len(parts.scheme) == 1:  # a plain path (or a Windows drive)
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


def _check_namespace(namespace: str) -> str:
    if not NAMESPACE.match(namespace):
        raise ValidationError(f"invalid namespace {namespace!r}: a lowercase letter, then up "
                              "to 31 of lowercase letters, digits, '_' and '-'",
                              namespace=namespace[:64])
    return namespace


def _hour(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y%m%d%H")


def _first_line(exc: BaseException) -> str:
    """An obstore error's first line (the rest is its debug source), at most 300 chars."""
    text = str(exc).split("\n", 1)[0].strip() or type(exc).__name__
    return text[:300]


_STATUS = re.compile(r"status code: (\d{3})")
_FULL = ("No space left", "Disk quota exceeded")
_GONE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EAGAIN, errno.EBUSY,
                errno.ETIMEDOUT, errno.ENOTCONN}


class Archive:
    """Archived sessions in one store: a local directory, an S3-compatible bucket, ...

    Made by :meth:`from_url`; every method is a coroutine bounded by ``timeout_s``. Use
    ``async with`` or :meth:`close` (the store holds no connection a process must end, but a
    closed archive refuses further calls).
    """

    def __init__(self, store: ObjectStore, url: str, *, root: Path | None = None,
                 timeout_s: float = TIMEOUT_S) -> None:
        self._store = store
        #: the archive's URL without credentials: what errors and logs name
        self.url = _redact(url)
        self._root = root  # a local directory's path: written files are fsync'd there
        self.timeout_s = timeout_s
        self._closed = False

    @classmethod
    def from_url(cls, url: str, *, timeout_s: float = TIMEOUT_S) -> Archive:
        """The archive at ``url`` (see the module's doc for the forms); a local directory is
        created if missing. A URL this cannot use is a :class:`~baton.errors.ConfigError`."""
        from obstore.store import LocalStore, MemoryStore
        from obstore.store import from_url as store_from_url

        if not url:
            raise ConfigError("no archive URL: give a directory or an s3:// URL")
        parts = urlsplit(url)
        scheme = parts.scheme.lower() if len(parts.scheme) > 1 else ""
        if scheme in ("", "file"):
            if scheme == "file" and parts.netloc not in ("", "localhost"):
                raise ConfigError(f"archive URL {_redact(url)}: a file URL names no host "
                                  "(file:///abs/path)")
            path = Path(unquote(parts.path) if scheme else url).expanduser().resolve()
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"cannot create the archive directory {path}: "
                                  f"{exc.strerror or exc}") from None
            return cls(LocalStore(path), str(path), root=path, timeout_s=timeout_s)
        if scheme == "memory":
            return cls(MemoryStore(), "memory:///", timeout_s=timeout_s)
        if scheme not in ("s3", "s3a", "gs", "az", "abfs", "abfss"):
            raise ConfigError(f"archive URL {_redact(url)}: expected a directory, file:///, "
                              "s3://bucket/prefix, gs:// or az://")
        # No client options: passing any would replace those obstore reads from the
        # environment (AWS_ALLOW_HTTP, proxies). Retries stop before the call's deadline, so
        # that an error says what went wrong rather than that time ran out.
        retry: Any = {"max_retries": 10,
                      "retry_timeout": timedelta(seconds=timeout_s * 0.75),
                      "backoff": {"init_backoff": timedelta(milliseconds=100),
                                  "max_backoff": timedelta(seconds=2)}}
        try:
            store = store_from_url(url, retry_config=retry)
        except Exception as exc:  # obstore's builder: a bad URL or configuration
            raise ConfigError(f"archive URL {_redact(url)}: {_first_line(exc)}") from None
        return cls(store, url, timeout_s=timeout_s)

    # -- sessions

    @staticmethod
    def session_key(namespace: str, session_id: str) -> str:
        """Where a session's object lives, relative to the archive's URL."""
        return (f"{_check_namespace(namespace)}/sessions/{check_session_id(session_id)}"
                f".json.{EXTENSION}")

    async def put(self, namespace: str, session_id: str, data: bytes) -> str:
        """Write a session's object (over any earlier one); return its key once the store
        confirmed the write."""
        key = self.session_key(namespace, session_id)
        await self._put(key, data)
        return key

    async def get(self, namespace: str, session_id: str) -> bytes | None:
        """A session's object, or None when the archive has none."""
        key = self.session_key(namespace, session_id)
        return await self._get(key)

    async def exists(self, namespace: str, session_id: str) -> bool:
        """Whether the archive holds the session's object (one HEAD)."""
        import obstore

        key = self.session_key(namespace, session_id)
        try:
            await self._call("read", key, lambda: _blocking(obstore.head, self._store, key))
        except FileNotFoundError:
            return False
        return True

    async def delete(self, namespace: str, session_id: str) -> None:
        """Remove a session's object (nothing happens when there is none)."""
        import obstore

        key = self.session_key(namespace, session_id)
        with contextlib.suppress(FileNotFoundError):
            await self._call("delete", key,
                             lambda: _blocking(obstore.delete, self._store, key))

    async def save(self, archived: ArchivedSession) -> str:
        """:meth:`put` of the session's :func:`encode`\\ d object."""
        return await self.put(archived.namespace, archived.session_id, encode(archived))

    async def load(self, namespace: str, session_id: str) -> ArchivedSession | None:
        """The archived session, or None; :class:`~baton.errors.CorruptStateError` when its
        object does not decode, or holds another session."""
        data = await self.get(namespace, session_id)
        if data is None:
            return None
        try:
            archived = decode(data)
        except CorruptStateError as exc:
            raise CorruptStateError(session_id, f"{exc.reason} (at "
                                    f"{self.session_key(namespace, session_id)})") from None
        if (archived.namespace, archived.session_id) != (namespace, session_id):
            raise CorruptStateError(session_id, f"the archive object at "
                                    f"{self.session_key(namespace, session_id)} holds session "
                                    f"{archived.session_id} of namespace {archived.namespace}")
        return archived

    # -- the index

    async def put_index(self, namespace: str, rows: Iterable[IndexRow]) -> list[str]:
        """Write a batch of index rows: one object per archival hour among them (one, as a
        rule). Returns the objects' keys."""
        _check_namespace(namespace)
        by_hour: dict[str, list[IndexRow]] = {}
        for row in rows:
            by_hour.setdefault(_hour(row.archived_ms), []).append(row)
        written = []
        for hour, batch in sorted(by_hour.items()):
            first = min(r.archived_ms for r in batch)
            key = (f"{namespace}/index/{hour}/{first:013d}-{secrets.token_hex(6)}"
                   f".jsonl.{EXTENSION}")
            body = b"".join(orjson.dumps(r.model_dump(mode="json")) + b"\n" for r in batch)
            await self._put(key, _compress(body))
            written.append(key)
        return written

    async def list_index(self, namespace: str, since_ms: int, until_ms: int, *,
                         agent: str | None = None, status: str | None = None,
                         limit: int = 1000) -> list[IndexRow]:
        """Rows of sessions archived in ``[since_ms, until_ms)``, newest first, at most
        ``limit``, of ``agent`` and ``status`` when given; a session's newest row only.
        Reads only the hour folders of the range (at most :data:`MAX_INDEX_HOURS`)."""
        _check_namespace(namespace)
        if until_ms <= since_ms or limit <= 0:
            return []
        first_hour, last_hour = since_ms // _HOUR_MS, (until_ms - 1) // _HOUR_MS
        if last_hour - first_hour + 1 > MAX_INDEX_HOURS:
            raise ValidationError(f"an index listing spans at most {MAX_INDEX_HOURS} hours; "
                                  f"asked for {last_hour - first_hour + 1}",
                                  namespace=namespace)
        newest: dict[str, IndexRow] = {}
        for hour in range(last_hour, first_hour - 1, -1):
            for row in await self._index_hour(namespace, _hour(hour * _HOUR_MS)):
                if not since_ms <= row.archived_ms < until_ms:
                    continue
                if (agent is not None and row.agent != agent) or (
                        status is not None and row.status != status):
                    continue
                held = newest.get(row.session_id)
                if held is None or row.archived_ms > held.archived_ms:
                    newest[row.session_id] = row
            if len(newest) >= limit:
                break  # every row of an earlier folder is older than this one's
        rows = sorted(newest.values(), key=lambda r: (r.archived_ms, r.session_id),
                      reverse=True)
        return rows[:limit]

    async def _index_hour(self, namespace: str, hour: str) -> list[IndexRow]:
        import obstore

        prefix = f"{namespace}/index/{hour}/"

        def listed() -> list[str]:
            return [meta["path"] for chunk in obstore.list(self._store, prefix,
                                                           chunk_size=1000)
                    for meta in chunk]
        try:
            paths = await self._call("list", prefix, lambda: asyncio.to_thread(listed))
        except FileNotFoundError:  # a local directory without the hour's folder
            return []
        gate = asyncio.Semaphore(INDEX_READS)

        async def rows_of(path: str) -> list[IndexRow]:
            async with gate:
                data = await self._get(path)
            if data is None:  # removed since the listing
                return []
            try:
                return [IndexRow.model_validate_json(line)
                        for line in _decompress(data, "").splitlines() if line]
            except (PydanticValidationError, CorruptStateError) as exc:
                raise CorruptStateError("", f"index object {path} does not decode: "
                                        f"{_first_line(exc)}") from None
        found = await asyncio.gather(*(rows_of(p) for p in paths))
        return [row for rows in found for row in rows]

    # -- the calls

    async def _put(self, key: str, data: bytes) -> None:
        import obstore

        await self._call("write", key, lambda: _blocking(obstore.put, self._store, key, data))
        if self._root is not None:
            root = self._root
            await self._call("write", key, lambda: asyncio.to_thread(_fsync, root / key))

    async def _get(self, key: str) -> bytes | None:
        import obstore

        def read_whole() -> bytes:
            return bytes(obstore.get(self._store, key).bytes())

        async def read() -> bytes:
            return await asyncio.to_thread(read_whole)
        try:
            data: bytes = await self._call("read", key, read)
        except FileNotFoundError:
            return None
        return data

    async def _call(self, operation: str, key: str,
                    work: Callable[[], Awaitable[Any]]) -> Any:
        """Await ``work()`` within the deadline, its failures as the archive's errors;
        FileNotFoundError (no such object) is the caller's to read."""
        if self._closed:
            raise ArchiveError(self.url, operation, key, "the archive was closed")
        try:
            async with asyncio.timeout(self.timeout_s):
                return await work()
        except FileNotFoundError as exc:
            if "NoSuchBucket" in str(exc):  # S3 answers a missing bucket as a missing key
                raise ArchiveError(self.url, operation, key, "no such bucket") from None
            raise
        except TimeoutError:
            raise ArchiveUnavailable(self.url, operation, key,
                                     f"no answer within {self.timeout_s:g} s") from None
        except Exception as exc:
            self._fail(operation, key, exc)

    def _fail(self, operation: str, key: str, exc: Exception) -> NoReturn:
        from obstore.exceptions import (
            BaseError,
            PermissionDeniedError,
            UnauthenticatedError,
        )

        reason = _first_line(exc)
        if isinstance(exc, PermissionDeniedError | UnauthenticatedError):
            raise ArchiveError(self.url, operation, key, reason) from None
        if isinstance(exc, OSError) and not isinstance(exc, PermissionError):
            if exc.errno in _GONE_ERRNOS:
                raise ArchiveUnavailable(self.url, operation, key, reason) from None
            raise ArchiveError(self.url, operation, key, reason) from None
        if isinstance(exc, BaseError):
            status = _STATUS.search(str(exc))
            code = int(status[1]) if status else 0
            if self._root is not None:  # a local directory: only a full disk passes
                if any(word in reason for word in _FULL):
                    raise ArchiveUnavailable(self.url, operation, key, reason) from None
            elif not code or code >= 500 or code in (408, 429):
                # No status: the request never got an answer (refused, reset, timed out).
                raise ArchiveUnavailable(self.url, operation, key, reason) from None
        raise ArchiveError(self.url, operation, key, reason) from None

    async def close(self) -> None:
        """Refuse further calls (idempotent)."""
        self._closed = True

    async def __aenter__(self) -> Archive:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"Archive({self.url!r})"


def _blocking(call: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    """An obstore call made with its blocking API in a worker thread.

    obstore's async API completes Python futures from its Rust runtime's threads; a process
    that exits while such a completion is on its way (a CLI command, after its one read)
    could abort in the interpreter's shutdown. The blocking API returns in the worker thread,
    so nothing reaches back into Python once the call is over.
    """
    return asyncio.to_thread(call, *args)


def _fsync(path: Path) -> None:
    """Make a written file and its name durable: the file, then its folder."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------ the view

_WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
_BAD_ID = "ERR Invalid stream ID specified as stream command argument"

#: The read commands :class:`ArchivedKeys` answers (its pipelines queue the same).
READS = frozenset({
    "hgetall", "hget", "hmget", "hvals", "hkeys", "hlen", "hexists", "lrange", "llen",
    "xrange", "xrevrange", "xlen", "exists", "get", "type", "zcard", "zscore", "zrange",
    "zcount", "zrangebyscore", "zrevrangebyscore",
})
#: Commands that would change a key: refused with :class:`ArchivedError`. (Scripts too:
#: a script cannot run on an object.)
WRITES = frozenset({
    "set", "setnx", "setex", "psetex", "getset", "getdel", "getex", "append", "incr",
    "incrby", "decr", "decrby", "delete", "unlink", "expire", "pexpire", "expireat",
    "pexpireat", "persist", "rename", "renamenx", "copy", "restore", "hset", "hsetnx",
    "hmset", "hdel", "hincrby", "hincrbyfloat", "hexpire", "hpexpire", "hgetdel", "hgetex",
    "hsetex", "lpush", "rpush", "lpushx", "rpushx", "lpop", "rpop", "lset", "lrem", "ltrim",
    "linsert", "lmove", "rpoplpush", "blpop", "brpop", "xadd", "xdel", "xtrim", "xack",
    "xclaim", "xautoclaim", "xreadgroup", "xsetid", "xgroup_create", "zadd", "zrem",
    "zincrby", "zpopmin", "zpopmax", "zremrangebyscore", "zremrangebyrank", "sadd", "srem",
    "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro", "publish", "spublish",
    "execute_command", "flushdb", "flushall",
})


def _stream_id(text: Any, *, high: bool) -> tuple[int, int]:
    """A stream id bound as XRANGE reads it: ``-``, ``+``, ``ms`` (the whole ms: its lowest
    or highest sequence) or ``ms-seq``."""
    text = text.decode() if isinstance(text, bytes) else str(text)
    if text == "-":
        return (0, 0)
    if text == "+":
        return (_MAX_ID_PART, _MAX_ID_PART)
    found = _STREAM_ID.match(text)
    if found is None:
        raise ResponseError(_BAD_ID)
    seq = found[2]
    return int(found[1]), int(seq) if seq is not None else (_MAX_ID_PART if high else 0)


def _bound(text: Any, *, high: bool) -> tuple[tuple[int, int], bool]:
    """An XRANGE bound and whether it is exclusive (``(`` before it)."""
    raw = text.decode() if isinstance(text, bytes) else str(text)
    if raw.startswith("("):
        if raw[1:] in ("-", "+"):
            raise ResponseError("ERR invalid start ID for the interval")
        return _stream_id(raw[1:], high=not high), True
    return _stream_id(raw, high=high), False


def _names(keys: Any, args: tuple[Any, ...]) -> list[Any]:
    """redis-py's ``list_or_args``: a key or a list of them, then more."""
    first = [keys] if isinstance(keys, str | bytes) else list(keys)
    return [*first, *args]


class ArchivedKeys:
    """An archived session's keys, read-only, answering as Redis would have.

    Each method is the redis-py command of the same name, with its arguments and its reply
    under ``decode_responses=True`` (RESP2 and RESP3 give the same shapes): HGETALL a dict,
    LRANGE/HVALS/HKEYS/HMGET lists, LLEN/HLEN/XLEN/EXISTS ints, HEXISTS a bool, HGET a str or
    None, XRANGE/XREVRANGE ``(id, fields)`` tuples. A key of another session or of the shard
    (timers, dead letters, the sessions index, the idempotency records) reads as missing, as
    does a family the session had nothing in; a command on a key of another type raises
    Redis' WRONGTYPE error. Commands that write raise :class:`ArchivedError`.
    :meth:`pipeline` queues the same reads and answers them in ``execute()``.
    """

    def __init__(self, archived: ArchivedSession, keys: SessionKeys) -> None:
        if keys.session_id != archived.session_id:
            raise ValueError(f"keys of session {keys.session_id} for the archived session "
                             f"{archived.session_id}")
        self.archived = archived
        self.keys = keys
        held: dict[str, tuple[str, Any]] = {
            getattr(keys, family): ("hash", getattr(archived, family))
            for family in _HASH_FAMILIES
        }
        held[keys.entries] = ("list", archived.entries)
        held[keys.receipts] = ("stream", archived.receipts)
        held[keys.receipts_hands] = ("stream", archived.receipts_hands)
        held[keys.receipts_client] = ("stream", archived.receipts_client)
        held[keys.nudge] = ("string", archived.nudge)
        # Redis keeps no empty key: a family without data is a missing key.
        self._held = {key: value for key, value in held.items() if value[1]}

    def _of(self, name: Any, kind: str) -> Any:
        """The data of key ``name`` if it holds a ``kind``; None when missing."""
        key = name.decode() if isinstance(name, bytes) else name
        found = self._held.get(key)
        if found is None:
            return None
        if found[0] != kind:
            raise ResponseError(_WRONGTYPE)
        return found[1]

    # -- the commands, answered at once (the async methods and pipelines call these)

    def _hgetall(self, name: Any) -> dict[str, str]:
        return dict(self._of(name, "hash") or {})

    def _hget(self, name: Any, key: str) -> str | None:
        value: str | None = (self._of(name, "hash") or {}).get(key)
        return value

    def _hmget(self, name: Any, keys: Any, *args: Any) -> list[str | None]:
        held = self._of(name, "hash") or {}
        return [held.get(k) for k in _names(keys, args)]

    def _hvals(self, name: Any) -> list[str]:
        return list((self._of(name, "hash") or {}).values())

    def _hkeys(self, name: Any) -> list[str]:
        return list(self._of(name, "hash") or {})

    def _hlen(self, name: Any) -> int:
        return len(self._of(name, "hash") or {})

    def _hexists(self, name: Any, key: str) -> bool:
        return key in (self._of(name, "hash") or {})

    def _lrange(self, name: Any, start: int, end: int) -> list[str]:
        held = self._of(name, "list") or []
        n = len(held)
        start, end = int(start), int(end)
        start = max(start + n, 0) if start < 0 else start
        end = end + n if end < 0 else min(end, n - 1)
        return list(held[start:end + 1]) if start <= end else []

    def _llen(self, name: Any) -> int:
        return len(self._of(name, "list") or [])

    def _xrange(self, name: Any, min: Any = "-", max: Any = "+",
                count: int | None = None) -> list[tuple[str, dict[str, str]]]:
        return self._stream(name, min, max, count, reverse=False)

    def _xrevrange(self, name: Any, max: Any = "+", min: Any = "-",
                   count: int | None = None) -> list[tuple[str, dict[str, str]]]:
        return self._stream(name, min, max, count, reverse=True)

    def _stream(self, name: Any, low: Any, high: Any, count: int | None, *,
                reverse: bool) -> list[tuple[str, dict[str, str]]]:
        (lo, lo_open), (hi, hi_open) = _bound(low, high=False), _bound(high, high=True)
        if count is not None and (not isinstance(count, int) or count < 1):
            raise DataError(f"{'XREVRANGE' if reverse else 'XRANGE'} count must be a "
                            "positive integer")  # as redis-py checks it, before sending
        held = self._of(name, "stream") or []
        out = []
        for rid, fields in reversed(held) if reverse else held:
            at = _stream_id(rid, high=False)
            if lo < at < hi or (at == lo and not lo_open) or (at == hi and not hi_open):
                out.append((rid, dict(fields)))
                if count is not None and len(out) >= count:
                    break
        return out

    def _xlen(self, name: Any) -> int:
        return len(self._of(name, "stream") or [])

    def _exists(self, *names: Any) -> int:
        return sum(1 for name in names
                   if (name.decode() if isinstance(name, bytes) else name) in self._held)

    def _get(self, name: Any) -> str | None:
        value: str | None = self._of(name, "string")
        return value

    def _type(self, name: Any) -> str:
        found = self._held.get(name.decode() if isinstance(name, bytes) else name)
        return found[0] if found else "none"

    # The session has no sorted set: the shard's timers and sessions index read as missing.
    def _zcard(self, name: Any) -> int:
        self._of(name, "zset")
        return 0

    def _zscore(self, name: Any, value: Any) -> None:
        self._of(name, "zset")

    def _zrange(self, name: Any, *args: Any, **kwargs: Any) -> list[Any]:
        self._of(name, "zset")
        return []

    def _zcount(self, name: Any, low: Any, high: Any) -> int:
        self._of(name, "zset")
        return 0

    _zrangebyscore = _zrange
    _zrevrangebyscore = _zrange

    # -- redis-py's names

    async def hgetall(self, name: Any) -> dict[str, str]:
        return self._hgetall(name)

    async def hget(self, name: Any, key: str) -> str | None:
        return self._hget(name, key)

    async def hmget(self, name: Any, keys: Any, *args: Any) -> list[str | None]:
        return self._hmget(name, keys, *args)

    async def hvals(self, name: Any) -> list[str]:
        return self._hvals(name)

    async def hkeys(self, name: Any) -> list[str]:
        return self._hkeys(name)

    async def hlen(self, name: Any) -> int:
        return self._hlen(name)

    async def hexists(self, name: Any, key: str) -> bool:
        return self._hexists(name, key)

    async def lrange(self, name: Any, start: int, end: int) -> list[str]:
        return self._lrange(name, start, end)

    async def llen(self, name: Any) -> int:
        return self._llen(name)

    async def xrange(self, name: Any, min: Any = "-", max: Any = "+",
                     count: int | None = None) -> list[tuple[str, dict[str, str]]]:
        return self._xrange(name, min, max, count)

    async def xrevrange(self, name: Any, max: Any = "+", min: Any = "-",
                        count: int | None = None) -> list[tuple[str, dict[str, str]]]:
        return self._xrevrange(name, max, min, count)

    async def xlen(self, name: Any) -> int:
        return self._xlen(name)

    async def exists(self, *names: Any) -> int:
        return self._exists(*names)

    async def get(self, name: Any) -> str | None:
        return self._get(name)

    async def type(self, name: Any) -> str:
        return self._type(name)

    async def zcard(self, name: Any) -> int:
        return self._zcard(name)

    async def zscore(self, name: Any, value: Any) -> None:
        return self._zscore(name, value)

    async def zrange(self, name: Any, *args: Any, **kwargs: Any) -> list[Any]:
        return self._zrange(name, *args, **kwargs)

    async def zcount(self, name: Any, low: Any, high: Any) -> int:
        return self._zcount(name, low, high)

    async def zrangebyscore(self, name: Any, *args: Any, **kwargs: Any) -> list[Any]:
        return self._zrange(name, *args, **kwargs)

    async def zrevrangebyscore(self, name: Any, *args: Any, **kwargs: Any) -> list[Any]:
        return self._zrange(name, *args, **kwargs)

    def pipeline(self, transaction: bool = True) -> ArchivedPipeline:
        """A pipeline of reads, answered in ``execute()`` (one snapshot: ``transaction``
        changes nothing)."""
        return ArchivedPipeline(self)

    def _refuse(self) -> NoReturn:
        """The error of a write: the session is archived."""
        a = self.archived
        raise ArchivedError(a.session_id, a.archived_ms, a.fence)

    def __getattr__(self, name: str) -> Any:
        if name in WRITES:
            self._refuse()
        raise AttributeError(f"an archived session answers only the reads "
                             f"{', '.join(sorted(READS))}, not {name!r}")


class ArchivedPipeline:
    """A pipeline on :class:`ArchivedKeys`: each read command queues and returns the
    pipeline (so calls chain, as redis-py's do); :meth:`execute` answers them in order. A
    write raises :class:`ArchivedError` when queued."""

    def __init__(self, view: ArchivedKeys) -> None:
        self._view = view
        self._queued: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        if name in READS:
            def queue(*args: Any, **kwargs: Any) -> ArchivedPipeline:
                self._queued.append((name, args, kwargs))
                return self
            return queue
        if name in WRITES or name in ("multi", "watch"):
            self._view._refuse()
        raise AttributeError(f"an archived session's pipeline queues only the reads "
                             f"{', '.join(sorted(READS))}, not {name!r}")

    def __len__(self) -> int:
        return len(self._queued)

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        """The replies, in order; an error reply (WRONGTYPE) is raised, or with
        ``raise_on_error=False`` returned in its place."""
        queued, self._queued = self._queued, []
        replies: list[Any] = []
        for name, args, kwargs in queued:
            try:
                replies.append(getattr(self._view, f"_{name}")(*args, **kwargs))
            except ResponseError as exc:
                if raise_on_error:
                    raise
                replies.append(exc)
        return replies

    def reset(self) -> None:
        self._queued = []

    async def __aenter__(self) -> ArchivedPipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.reset()

