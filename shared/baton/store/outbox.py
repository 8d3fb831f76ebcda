"""The relay's side of the store: the outbox rows of each shard, and the shard work beside
the rows: relay leases, timers, requests waiting in inboxes.

Each shard has one outbox stream read through the consumer group ``relay``. Live relays
divide the shards by fenced leases (``relay_lease.lua``): a relay reads, claims and fires
timers only on the shards it holds, and acknowledges (deletes) rows only while it still
holds their shard with the same fence (``relay_ack.lua``). A row stays pending until
acknowledged; the rows a relay read but never acknowledged (it died, or lost the shard) are
claimed by the shard's holder after ``relay_claim_idle_ms``. A row is deleted only after
NATS acknowledged its publish. :class:`Outbox` owns this layout (keys, group, reply
shapes); the relay only decides what to publish and when.

A relay fires timers (``fire_timers.lua``) and arms the deadlines of requests still waiting
in an inbox (``arm_requests.lua``) only on the shards it holds, each script refusing a
holder whose fence is no longer the shard's; :class:`Outbox` owns these keys and scripts
too, and the backlog gauge's reads.

Each shard also has a ``wakes`` stream: the wake rows Hands write when a tool result
arrives (complete.lua). It has the outbox's fields and consumer group and is read, claimed
and acknowledged with it; its rows carry ``w`` in their stream id (``<shard>:w:<id>``) so
the relay can hold them to the one thing a Hands may ask for: waking that session on its
own wake subject (:meth:`Outbox.wake_subjects`).

On a Redis Cluster every shard is its own slot, and a multi-key command (one XREADGROUP
over several streams) must stay within one slot even when the slots share a node, so
:meth:`Outbox.groups` gives one read group per shard there; on one server all held shards
are read by one XREADGROUP.

With a :class:`~baton.store.replication.ReplicatedWrites` (a cluster, ``min_replicas`` > 0)
the two writes that settle work, a relay ack and a timer firing, are acknowledged only once
a replica has them, like session commits: a relay ack lost with a failed primary would make
the new holder publish its rows again (deduplicated only within JetStream's window), a
timer firing lost would wake its session a second time. Both scripts are idempotent, so a
write in doubt is simply retried; past the budget the caller sees
:class:`~baton.errors.WriteInDoubtError` and treats it as a failed call (the rows stay
pending, the timer stays due).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError
from redis.typing import KeyT, StreamIdT

from baton.errors import ValidationError
from baton.models import OutboxRow, dumps, loads
from baton.observability.log import error_text, get_logger
from baton.store.keys import RELAY_GROUP, Keys
from baton.store.redis_client import REDIS_ERRORS, is_cluster, run_batch
from baton.store.replication import ReplicatedWrites, missing
from baton.store.scripts import Function, Scripts

WAKES = "w"  # the stream-id marker of rows from a shard's wakes stream
# The id of a client's request's wake row: "<sid>/<seq>/s.<request>" (submit), "t.<request>"
# (start), "c.<ms>" (cancel) or "d.<ms>" (an approval's decision); the Hands' wake rows are
# "w.<run>.<attempt>". Before its session's first commit (seq 0) a submit or start may open it.
_REQUEST = re.compile(r"^[^/]+/\d+/[stcd]\.")
_OPENING = re.compile(r"^[^/]+/0/[st]\.")

log = get_logger("baton.relay")

# A session's inbox key, "<ns>:{<ns>-<shard>}:s:<session id>:inbox" (checked against the
# session's own key, so a key of another shard or namespace is skipped).
_INBOX_KEY = re.compile(r"^[^{]*\{[^}]*\}:s:(.+):inbox$")


@dataclass(frozen=True, slots=True)
class Backlog:
    shard: int
    rows: int
    oldest_ms: int | None
    pending: int


@dataclass(frozen=True, slots=True)
class LeaseAnswer:
    """A relay lease script's answer: ``ok`` with this relay's ``fence``, or the holder.

    ``holder`` of an acquisition that succeeded: the relay whose lease had lapsed ('' when
    the shard was free or ours)."""

    ok: bool
    fence: int = 0
    holder: str = ""


def parse_row(shard: int, stream_id: str, f: dict[str, str], stream: str = "") -> OutboxRow:
    """A row from its stream fields; never raises.

    A malformed row (missing field, bad header JSON; only possible when something other
    than Baton's scripts wrote it) comes back with an empty subject and its raw fields as
    data, so the relay dead-letters it instead of failing the read of the whole batch.
    """
    try:
        return OutboxRow(
            id=f["id"],
            subject=f["subj"],
            data=f["data"],
            headers=loads(f["hdr"]) if f.get("hdr") else {},
            session_id=f.get("sid", ""),
            ts_ms=int(f.get("ts", 0)),
            stream_id=f"{shard}:{stream}:{stream_id}" if stream else f"{shard}:{stream_id}",
        )
    except (KeyError, ValueError, TypeError, ValidationError):
        return OutboxRow(
            id=str(f.get("id", "")),
            subject="",
            data=dumps(f),
            session_id=str(f.get("sid", "")),
            stream_id=f"{shard}:{stream}:{stream_id}" if stream else f"{shard}:{stream_id}",
        )


def _stream_entries(reply: Any) -> Iterator[tuple[str, list[tuple[str, dict[str, str] | None]]]]:
    """(key, entries) pairs of an XREADGROUP reply, RESP2 or RESP3 shaped."""
    items = reply.items() if isinstance(reply, dict) else reply or []
    for key, entries in items:
        if len(entries) == 1 and entries[0] and not isinstance(entries[0][0], str):
            entries = entries[0]  # RESP3 wraps the entry list once more
        yield key, entries


class Outbox:
    """Outbox and wakes rows over the shards of a namespace, with the shards' relay
    leases, timers and waiting requests."""

    def __init__(self, redis: Redis, keys: Keys, *,
                 writes: ReplicatedWrites | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.scripts = Scripts(redis)
        #: Replica acknowledgement of acks and timer firings (None: a primary's reply is enough).
        self.writes = writes if writes is not None and writes.min_replicas > 0 else None
        self.cluster = is_cluster(redis)
        self._by_key = {keys.outbox(s): (s, "") for s in range(keys.shards)}
        self._by_key.update({keys.wakes(s): (s, WAKES) for s in range(keys.shards)})
        self._reads: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    # ---------------------------------------------------- shard leases, timers, requests

    def _streams(self, shard: int) -> list[str]:
        """A shard's streams of rows to publish: its outbox and its wakes."""
        return [self.keys.outbox(shard), self.keys.wakes(shard)]

    async def lease(self, op: str, shard: int, holder: str, ttl_ms: int,
                    fence: int = 0) -> LeaseAnswer:
        """Acquire, renew or release the relay lease of a shard (see relay_lease.lua)."""
        reply = await self.scripts.relay_lease(
            keys=[self.keys.relay_lease(shard)], args=[op, holder, ttl_ms, fence])
        if int(reply[0]) == 1:  # an acquire names the relay whose lease had lapsed, if any
            return LeaseAnswer(True, int(reply[1]), str(reply[2]) if len(reply) > 2 else "")
        return LeaseAnswer(False, int(reply[2]) if op != "acquire" else 0, str(reply[1]))

    async def renew_all(self, held: dict[int, int], holder: str, ttl_ms: int,
                        failed: dict[int, Exception] | None = None) -> dict[int, LeaseAnswer]:
        """Renew the leases of every held shard (``shard -> fence``): one script call for
        all of them on a single server (relay_lease.lua takes several keys there), one
        call per shard on a Redis Cluster, where a script's keys share one slot.

        With ``failed``, a shard whose call fails on a cluster (its primary down or
        refusing writes) is left out of the answer and its error put there, so the shards
        of the healthy primaries are still renewed; without it, the first error raises."""
        if self.cluster or len(held) < 2:
            out: dict[int, LeaseAnswer] = {}
            for shard, fence in held.items():
                try:
                    out[shard] = await self.lease("renew", shard, holder, ttl_ms, fence)
                except REDIS_ERRORS as exc:
                    if failed is None:
                        raise
                    failed[shard] = exc
            return out
        replies = await self.scripts.relay_lease(
            keys=[self.keys.relay_lease(shard) for shard in held],
            args=["renew", holder, ttl_ms, *held.values()])
        return {shard: LeaseAnswer(True, int(r[1])) if int(r[0]) == 1
                else LeaseAnswer(False, int(r[2]), str(r[1]))
                for shard, r in zip(held, replies, strict=True)}

    async def look(self, shards: list[int]) -> dict[int, tuple[str, int]] | None:
        """Each shard's lease holder and the ms it has left (``''``/0 when free), in one
        read-only call; None on a Redis Cluster, where it would take a call per shard."""
        if self.cluster or not shards:
            return None
        replies = await self.scripts.relay_lease(
            keys=[self.keys.relay_lease(shard) for shard in shards], args=["look", "", 0])
        return {shard: (str(r[0]), int(r[1])) for shard, r in zip(shards, replies, strict=True)}

    async def fire_timers(self, shard: int, limit: int, rearm_ms: int, holder: str,
                          fence: int) -> int:
        """Turn due timers of a shard into outbox wake rows; returns how many fired, or -1
        when ``holder`` no longer holds the shard's lease with ``fence``.

        The shard's ``limit`` earliest timers are read first, so the script can declare
        the keys of their sessions (see fire_timers.lua): one more round trip, made only
        when a timer is due (the relay's timer loop reads each shard's earliest first)."""
        prefix = f"{self.keys.ns}:{self.keys.tag(shard)}:s:"
        due = await self.redis.zrange(self.keys.timers(shard), 0, limit - 1)
        sessions: dict[str, None] = {}
        for member in due:
            parts = (member.decode() if isinstance(member, bytes) else str(member)).split("|")
            if len(parts) >= 4:
                sessions[parts[1]] = None
        return int(await self._write(
            "fire_timers",
            [self.keys.timers(shard), self.keys.outbox(shard), self.keys.relay_lease(shard),
             *(f"{prefix}{sid}:{k}" for sid in sessions for k in ("meta", "inbox", "nudge"))],
            [limit, rearm_ms, prefix, holder, fence]))

    async def waiting_requests(self, shards: list[int]) -> dict[int, list[str]]:
        """The sessions of ``shards`` whose inbox holds requests (shard -> session ids), by
        one ``SCAN`` of the keyspace (of every primary, on a cluster): the inbox is the one
        key a client's request writes, so this finds a request whatever became of its wake."""
        wanted, found = set(shards), dict[int, list[str]]()
        pattern = f"{self.keys.ns}:{{{self.keys.ns}-*}}:s:*:inbox"
        async for key in self.redis.scan_iter(match=pattern, count=1000, _type="hash"):
            key = key.decode() if isinstance(key, bytes) else key
            m = _INBOX_KEY.match(key)
            try:
                sk = self.keys.session(m.group(1)) if m else None
            except ValidationError:
                continue
            if sk is not None and sk.inbox == key and sk.shard in wanted:
                found.setdefault(sk.shard, []).append(sk.session_id)
        return found

    async def requested(self, shards: list[int], limit: int) -> dict[int, list[str]]:
        """The sessions of ``shards`` whose request wakes were published since the last sweep
        (the ``requested`` set the relay writes with its acks, see ``Outbox.requests``), at
        most ``limit`` per shard, oldest first: shard -> session ids, in one round trip (a
        read per shard on a cluster). What the sweep costs grows with the requests since,
        not with the sessions kept."""
        if not shards:
            return {}
        replies = await run_batch(self.redis, [
            ("ZRANGE", self.keys.requested(shard), 0, limit - 1) for shard in shards])
        found: dict[int, list[str]] = {}
        for shard, reply in zip(shards, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            if reply:
                found[shard] = [m.decode() if isinstance(m, bytes) else str(m) for m in reply]
        return found

    async def arm_requests(self, shard: int, session_ids: list[str], holder: str,
                           fence: int, deadline_ms: int) -> int:
        """Arm, due ``deadline_ms`` from now, the progress deadline of each session whose
        inbox still holds requests, and drop the sessions from the shard's ``requested``
        set (``arm_requests.lua``); returns how many were armed, or -1 when ``holder`` no
        longer holds the shard's lease with ``fence``."""
        prefix = f"{self.keys.ns}:{self.keys.tag(shard)}:s:"
        return int(await self._write(
            "arm_requests", [self.keys.timers(shard), self.keys.relay_lease(shard),
                             self.keys.sessions(shard), self.keys.requested(shard),
                             *(f"{prefix}{sid}:{k}" for sid in session_ids
                               for k in ("inbox", "poison", "meta")),
                             self.keys.admission(shard)[3]],
            [holder, fence, prefix, deadline_ms, *session_ids]))

    async def _write(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run a shard script; with :attr:`writes`, answered once a replica has its writes.

        The commit id only names the attempt in logs: both scripts are idempotent (an ack of
        deleted rows acks nothing, a fired timer is gone or re-armed), so they need no
        applied-reply record.
        """
        script = getattr(self.scripts, name)
        if self.writes is None:
            return await script(keys=keys, args=args)
        reply, _ = await self.writes.run(script, keys, args, commit_id=uuid.uuid4().hex,
                                         what=name)
        return reply

    async def timer_heads(self, shards: list[int]) -> tuple[int, dict[int, int]]:
        """Redis' clock (ms) and each shard's earliest timer.

        One round trip on a single server; on a cluster TIME cannot ride in a pipeline
        (it has no key to route by), so the clock is one more call, to any node: the
        scripts compare due times with their own node's clock, this only sizes the sleep.
        """
        async with self.redis.pipeline(transaction=False) as p:
            if not self.cluster:
                p.time()
            for shard in shards:
                p.zrange(self.keys.timers(shard), 0, 0, withscores=True)
            replies = await p.execute()
        clock = await self.redis.time() if self.cluster else replies.pop(0)
        sec, usec = clock
        heads = {s: int(r[0][1]) for s, r in zip(shards, replies, strict=True) if r}
        return int(sec) * 1000 + int(usec) // 1000, heads

    async def backlog(self) -> list[Backlog]:
        async with self.redis.pipeline(transaction=False) as p:
            for s in range(self.keys.shards):
                for key in self._streams(s):
                    p.xlen(key)
                    p.xrange(key, "-", "+", count=1)
            replies = await p.execute()
        out = []
        for s in range(self.keys.shards):
            n, first, wn, wfirst = replies[4 * s:4 * s + 4]
            heads = [int(f[0][0].split("-")[0]) for f in (first, wfirst) if f]
            out.append(Backlog(shard=s, rows=int(n) + int(wn),
                               oldest_ms=min(heads) if heads else None, pending=0))
        return out

    # ------------------------------------------------------------------ rows

    def groups(self, shards: list[int]) -> list[list[int]]:
        """Shards one XREADGROUP may read together: all on one server, one per slot on a
        cluster (a multi-key command never spans slots, even on one node)."""
        if not shards:
            return []
        return [[s] for s in shards] if self.cluster else [list(shards)]

    async def pending_counts(self, shards: list[int]) -> dict[int, int]:
        """Rows read but not acknowledged, per shard, in its outbox and wakes streams (one
        pipelined XPENDING summary each; a stream without its group counts as pending so
        that its claim recreates it)."""
        async with self.redis.pipeline(transaction=False) as p:
            for shard in shards:
                for key in self._streams(shard):
                    p.xpending(key, RELAY_GROUP)
            replies = await p.execute(raise_on_error=False)
        n = len(self._streams(shards[0])) if shards else 0
        return {s: sum(1 if isinstance(r, Exception) else int(r.get("pending") or 0)
                       for r in replies[i * n:(i + 1) * n])
                for i, s in enumerate(shards)}

    async def ensure_groups(self, shards: list[int] | None = None,
                            failed: dict[int, Exception] | None = None) -> None:
        """The consumer groups of these shards' streams (all by default), created if missing.

        With ``failed``, a shard whose primary refuses the write (a Redis Cluster primary
        without its replica, under min-replicas-to-write) is put there and the others are
        still done: a read that finds a group missing creates it later (NOGROUP)."""
        for shard in shards if shards is not None else range(self.keys.shards):
            try:
                for key in self._streams(shard):
                    try:
                        await self.redis.xgroup_create(key, RELAY_GROUP, id="0",
                                                       mkstream=True)
                    except ResponseError as exc:
                        if "BUSYGROUP" not in str(exc):
                            raise
            except REDIS_ERRORS as exc:
                if failed is None:
                    raise
                failed[shard] = exc

    async def read(
        self, shards: list[int], consumer: str, count: int, block_ms: int | None
    ) -> list[OutboxRow]:
        """New rows of these shards for this consumer (blocks up to block_ms if none)."""
        rows, _ = await self._read_group(shards, consumer, ">", count, block_ms)
        return rows

    async def read_pending(
        self, shards: list[int], consumer: str, count: int
    ) -> tuple[list[OutboxRow], bool]:
        """Rows this consumer read earlier and has not acknowledged (its own pending list).

        Returns the rows and whether more may be pending. Entries whose row was already
        deleted come back without fields: they are acknowledged here.
        """
        rows: list[OutboxRow] = []
        gone: dict[str, list[str]] = {}
        for group in self.groups(shards):
            got, deleted = await self._read_group(group, consumer, "0", count, None)
            rows += got
            gone.update(deleted)
        for key, ids in gone.items():
            await self.redis.xack(key, RELAY_GROUP, *ids)
        return rows, bool(rows or gone)

    async def _read_group(
        self, shards: list[int], consumer: str, start: str, count: int, block_ms: int | None
    ) -> tuple[list[OutboxRow], dict[str, list[str]]]:
        """XREADGROUP from ``start`` ("0": own pending, ">": new): the rows, and the ids of
        entries whose row was deleted, by stream key. A missing group is recreated."""
        try:
            if self.cluster:  # redis-py routes the read by its keys
                streams: dict[KeyT, StreamIdT] = {
                    k: start for s in shards for k in self._streams(s)}
                reply = await self.redis.xreadgroup(
                    RELAY_GROUP, consumer, streams, count=count, block=block_ms
                )
            else:
                reply = await self.redis.execute_command(
                    *self._read_command(shards, consumer, start, count, block_ms))
        except ResponseError as exc:
            if "WRONGTYPE" in str(exc) and len(shards) > 1:
                return await self._read_apart(shards, consumer, start, count, block_ms)
            if "NOGROUP" not in str(exc):
                raise
            await self.ensure_groups(shards)
            return [], {}
        return self._entries(reply)

    async def _read_apart(
        self, shards: list[int], consumer: str, start: str, count: int, block_ms: int | None
    ) -> tuple[list[OutboxRow], dict[str, list[str]]]:
        """One shard's stream of another type (an operator's mistake) fails the read of
        every shard: read them one by one, so the others go on, and say which is broken."""
        rows: list[OutboxRow] = []
        gone: dict[str, list[str]] = {}
        for shard in shards:
            try:
                more, deleted = await self._read_group([shard], consumer, start, count, None)
            except ResponseError as exc:
                if "WRONGTYPE" not in str(exc):
                    raise
                log.error("outbox_stream_wrong_type", shard=shard,
                          keys=[str(k) for k in self._streams(shard)], error=error_text(exc))
                continue
            rows += more
            gone |= deleted
        if not rows and not gone and block_ms:  # the wait the blocking read would have made
            await asyncio.sleep(block_ms / 1000)
        return rows, gone

    def _entries(self, reply: Any) -> tuple[list[OutboxRow], dict[str, list[str]]]:
        """The rows of an XREADGROUP reply, and the ids of entries whose row was deleted,
        by stream key."""
        rows: list[OutboxRow] = []
        gone: dict[str, list[str]] = {}
        for key, entries in _stream_entries(reply):
            shard, stream = self._by_key[key]
            for stream_id, fields in entries:
                if fields:
                    rows.append(parse_row(shard, stream_id, fields, stream))
                else:  # a deleted row still pending has no fields
                    gone.setdefault(key, []).append(stream_id)
        return rows, gone

    def _read_command(self, shards: list[int], consumer: str, start: str, count: int,
                      block_ms: int | None) -> tuple[Any, ...]:
        """The XREADGROUP of these shards' streams, as redis-py's ``xreadgroup`` sends it,
        built once per shard set (a reader sends the same one again and again)."""
        key = (tuple(shards), consumer, start, count, block_ms)
        command = self._reads.get(key)
        if command is None:
            streams = [k for s in shards for k in self._streams(s)]
            block = ("BLOCK", block_ms) if block_ms is not None else ()
            command = ("XREADGROUP", "GROUP", RELAY_GROUP, consumer, "COUNT", count, *block,
                       "STREAMS", *streams, *[start] * len(streams))
            if len(self._reads) >= 16:  # shard sets of a few rebalances
                self._reads.clear()
            self._reads[key] = command
        return command

    async def ack(self, rows: list[OutboxRow], holder: str, fences: dict[int, int],
                  requests: Sequence[OutboxRow] = ()) -> dict[int, str]:
        """Acknowledge and delete published rows, per shard under its lease fence (every
        shard's script in one round trip on a single server without replica
        acknowledgement, one call per shard otherwise), and index the sessions of the
        ``requests`` rows (:meth:`requests`), in the same round trip on a single server and
        before the acks delete their rows.

        Returns the shards whose lease is no longer ``holder``'s with the fence in
        ``fences`` (shard -> current holder): their rows were left in place for the new
        holder, which re-publishes them under the same ``Nats-Msg-Id``.
        """
        by_stream = self._by_stream(rows)
        index = self._index_commands(requests)  # before the acks delete their rows
        if not by_stream:
            await self._run_checked(index)
            return {}
        calls = self._ack_calls(by_stream, holder, fences)
        if self.cluster or self.writes is not None:
            await self._run_checked(index)
            replies = await asyncio.gather(*(self._write("relay_ack", keys, args)
                                             for keys, args in calls))
        else:  # one server, no replica wait: every shard's ack in one round trip
            script = self.scripts.relay_ack
            for attempt in (1, 2):
                replies = await run_batch(self.redis, [*index, *self._commands(script, calls)])
                if attempt == 1 and any(missing(r) for r in replies):
                    # The server has no library (a node restarted empty): load it, ack
                    # again (an ack of rows acknowledged already acknowledges nothing).
                    await script.load()
                    continue
                break
            for r in replies:
                if isinstance(r, Exception):
                    raise r
            replies = replies[len(index):]
        return _lost(by_stream, replies)

    async def ack_and_read(
        self, rows: list[OutboxRow], holder: str, fences: dict[int, int], shards: list[int],
        count: int, block_ms: int, acked: Callable[[dict[int, str]], None],
        requests: Sequence[OutboxRow] = (),
    ) -> list[OutboxRow]:
        """:meth:`ack` of ``rows`` (and ``requests``), then :meth:`read` of ``shards`` for
        ``holder``: the batch just published is settled before the read for the next is
        sent. ``acked`` gets what :meth:`ack` returns as soon as the acks' replies are in,
        before the read (which may block up to ``block_ms``) is waited for. Should an ack
        fail, the error is raised and nothing is read: the rows stay pending."""
        acked(await self.ack(rows, holder, fences, requests))
        return await self.read(shards, holder, count, block_ms)

    @staticmethod
    def _by_stream(rows: list[OutboxRow]) -> dict[tuple[int, str], list[str]]:
        """The stream ids of ``rows`` by (shard, stream marker)."""
        by_stream: dict[tuple[int, str], list[str]] = {}
        for row in rows:
            shard_text, _, sid = row.stream_id.partition(":")
            stream, _, wake_id = sid.partition(":")
            if wake_id and stream == WAKES:
                by_stream.setdefault((int(shard_text), WAKES), []).append(wake_id)
            else:
                by_stream.setdefault((int(shard_text), ""), []).append(sid)
        return by_stream

    def _ack_calls(self, by_stream: dict[tuple[int, str], list[str]], holder: str,
                   fences: dict[int, int]) -> list[tuple[list[str], list[Any]]]:
        """relay_ack's keys and arguments, one call per stream of ``by_stream``."""
        return [([self.keys.relay_lease(shard),
                  self.keys.wakes(shard) if stream else self.keys.outbox(shard)],
                 [holder, fences.get(shard, 0), *ids])
                for (shard, stream), ids in by_stream.items()]

    @staticmethod
    def _commands(script: Function, calls: list[tuple[list[str], list[Any]]]
                  ) -> list[tuple[Any, ...]]:
        return [script.command(keys, args) for keys, args in calls]

    async def wake_subjects(self, rows: list[OutboxRow]) -> dict[str, str | None]:
        """The wake subject of the session of each wakes-stream row (by stream id; None
        for an unknown session): the only subject such a row may be published on. It is the
        committed one; for a session not opened yet, the row's own when a submit or start
        request waiting in the session's inbox names it (a wake is a hint: the Brain that
        takes it checks the request)."""
        wakes = [r for r in rows if r.stream_id.split(":")[1:2] == [WAKES]]
        if not wakes:
            return {}
        keys: list[tuple[str, str] | None] = []
        for row in wakes:
            try:
                sk = self.keys.session(row.session_id)
                keys.append((sk.meta, sk.inbox))
            except ValidationError:
                keys.append(None)
        answers = await run_batch(self.redis, [
            command for k in keys if k is not None
            for command in (("HGET", k[0], "wake"), ("HVALS", k[1]))])
        for answer in answers:
            if isinstance(answer, Exception):
                raise answer
        replies = iter(answers)
        out: dict[str, str | None] = {}
        for row, k in zip(wakes, keys, strict=True):
            if k is None:
                out[row.stream_id] = None
                continue
            committed, pending = next(replies), next(replies)
            out[row.stream_id] = committed or _requested_wake(row.subject, pending)
        return out

    async def claim_stale(
        self, shard: int, consumer: str, idle_ms: int, count: int
    ) -> list[OutboxRow]:
        """Take over rows another relay read but did not acknowledge for idle_ms."""
        rows: list[OutboxRow] = []
        for key in self._streams(shard):
            stream = self._by_key[key][1]
            try:
                reply = await self.redis.xautoclaim(
                    key, RELAY_GROUP, consumer, min_idle_time=idle_ms, start_id="0-0",
                    count=count)
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                await self.ensure_groups([shard])
                return []
            entries = reply[1]
            deleted = reply[2] if len(reply) > 2 else []
            if deleted:
                await self.redis.xack(key, RELAY_GROUP, *deleted)
            rows += [parse_row(shard, sid, f, stream) for sid, f in entries if f]
        return rows

    @staticmethod
    def requests(rows: list[OutboxRow]) -> list[OutboxRow]:
        """The wakes-stream rows among ``rows`` that are a client's request (submit, start,
        cancel, decision). A client writes no shard-wide index, so once their wakes are
        published the relay indexes their sessions (:meth:`_index_commands`):

        * in the shard's ``requested`` set (scored by the row's time): the sessions the
          relay's next inbox sweep looks at (:mod:`baton.relay.timers`), so a request whose
          wake message is lost after its publish is found without scanning the keyspace;
        * a submit or start of a session's first commit sequence (it may open the session)
          in the shard's session index (ZADD NX), so a session stays listed from its first
          request on, as ``inspect`` shows a request waiting for a Brain (e.g. for a level
          none serves).

        The Hands' wake rows and the outbox's rows are not requests and cost nothing."""
        return [r for r in rows if r.stream_id.split(":")[1:2] == [WAKES]
                and _REQUEST.match(r.id)]

    def _index_commands(self, requests: Sequence[OutboxRow]) -> list[tuple[Any, ...]]:
        commands: list[tuple[Any, ...]] = []
        for row in requests:
            shard = int(row.stream_id.partition(":")[0])
            at = int(row.stream_id.rpartition(":")[2].partition("-")[0] or 0)
            commands.append(("ZADD", self.keys.requested(shard), at, row.session_id))
            if _OPENING.match(row.id):
                commands.append(("ZADD", self.keys.sessions(shard), "NX", at, row.session_id))
        return commands

    async def _run_checked(self, commands: list[tuple[Any, ...]]) -> None:
        if not commands:
            return
        for reply in await run_batch(self.redis, commands):
            if isinstance(reply, Exception):
                raise reply


def _lost(by_stream: dict[tuple[int, str], list[str]], replies: list[Any]) -> dict[int, str]:
    """The shards whose relay_ack (one reply per stream of ``by_stream``) was refused, with
    the lease's current holder."""
    return {shard: str(reply[1]) for (shard, _), reply in zip(by_stream, replies, strict=True)
            if int(reply[0]) != 1}


def _requested_wake(subject: str, pending: list[str]) -> str | None:
    """``subject`` when a request among ``pending`` (inbox values: a submit or start, or a
    restore of an archived session, see ask_restore.lua) names it as its wake subject, else
    None."""
    for raw in pending:
        try:
            wake = loads(raw).get("wake")
        except (ValueError, AttributeError):
            continue
        if wake == subject:
            return subject
    return None
