"""The relay's side of the store: the outbox rows of each shard (its leases, timers and
waiting requests are :mod:`baton.store.shard_store`'s).

Each shard has one outbox stream read through the consumer group ``relay``. Live relays
divide the shards by fenced leases (``relay_lease.lua``): a relay reads, claims and fires
timers only on the shards it holds, and acknowledges (deletes) rows only while it still
holds their shard with the same fence (``relay_ack.lua``). A row stays pending until
acknowledged; the rows a relay read but never acknowledged (it died, or lost the shard) are
claimed by the shard's holder after ``relay_claim_idle_ms``. A row is deleted only after
NATS acknowledged its publish. :class:`Outbox` owns this layout (keys, group, reply
shapes); the relay only decides what to publish and when.

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
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError
from redis.typing import KeyT, StreamIdT

from baton.errors import ValidationError
from baton.models import OutboxRow, dumps, loads
from baton.observability.log import error_text, get_logger
from baton.store.keys import RELAY_GROUP, Keys
from baton.store.redis_client import REDIS_ERRORS, run_batch
from baton.store.replication import ReplicatedWrites, missing
from baton.store.scripts import Function
from baton.store.shard_store import ShardStore

WAKES = "w"  # the stream-id marker of rows from a shard's wakes stream
# The id of a client's request's wake row: "<sid>/<seq>/s.<request>" (submit), "t.<request>"
# (start), "c.<ms>" (cancel) or "d.<ms>" (an approval's decision); the Hands' wake rows are
# "w.<run>.<attempt>". Before its session's first commit (seq 0) a submit or start may open it.
_REQUEST = re.compile(r"^[^/]+/\d+/[stcd]\.")
_OPENING = re.compile(r"^[^/]+/0/[st]\.")

log = get_logger("baton.relay")


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


class Outbox(ShardStore):
    """Outbox and wakes rows over the shards of a namespace, with the shards' leases,
    timers and waiting requests (:class:`~baton.store.shard_store.ShardStore`)."""

    def __init__(self, redis: Redis, keys: Keys, *,
                 writes: ReplicatedWrites | None = None) -> None:
        super().__init__(redis, keys, writes=writes)
        self._by_key = {keys.outbox(s): (s, "") for s in range(keys.shards)}
        self._by_key.update({keys.wakes(s): (s, WAKES) for s in range(keys.shards)})
        self._reads: dict[tuple[Any, ...], tuple[Any, ...]] = {}

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
