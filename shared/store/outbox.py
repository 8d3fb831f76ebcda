"""The relay's side of the store: outbox rows and timers of each shard.

Each shard has one outbox stream read through the consumer group ``relay``: relays share
the rows, a row stays pending until acknowledged, and the pending rows of a relay that died
are claimed by another after ``relay_claim_idle_ms``. A row is deleted only after NATS
acknowledged its publish.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from baton.errors import ValidationError
from baton.models import OutboxRow, dumps, loads
from baton.store.keys import RELAY_GROUP, Keys
from baton.store.scripts import Scripts


def parse_row(shard: int, stream_id: str, f: dict[str, str]) -> OutboxRow:
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
            stream_id=f"{shard}:{stream_id}",
        )
    except (KeyError, ValueError, TypeError, ValidationError):
        return OutboxRow(
            id=str(f.get("id", "")),
            subject="",
            data=dumps(f),
            session_id=str(f.get("sid", "")),
            stream_id=f"{shard}:{stream_id}",
        )


@dataclass(frozen=True, slots=True)
class Backlog:
    shard: int
    rows: int
    oldest_ms: int | None
    pending: int


class Outbox:
    """Outbox and timer operations over all shards of a namespace."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self.scripts = Scripts(redis)
        self._by_key = {keys.outbox(s): s for s in range(keys.shards)}

    async def ensure_groups(self, shards: list[int] | None = None) -> None:
        for shard in shards if shards is not None else range(self.keys.shards):
            try:
                await self.redis.xgroup_create(
                    self.keys.outbox(shard), RELAY_GROUP, id="0", mkstream=True
                )
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def read(
        self, shards: list[int], consumer: str, count: int, block_ms: int | None
    ) -> list[OutboxRow]:
        """New rows of these shards for this consumer (blocks up to block_ms if none)."""
        streams = {self.keys.outbox(s): ">" for s in shards}
        try:
            reply = await self.redis.xreadgroup(
                RELAY_GROUP, consumer, streams, count=count, block=block_ms
            )
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self.ensure_groups(shards)
            return []
        return self._rows(reply)

    def _rows(self, reply: object) -> list[OutboxRow]:
        rows = []
        items = reply.items() if isinstance(reply, dict) else reply or []
        for key, entries in items:  # type: ignore[union-attr]
            shard = self._by_key[key]
            if entries and isinstance(entries[0], list) and len(entries) == 1 and not isinstance(
                entries[0][0], str
            ):
                entries = entries[0]
            for stream_id, fields in entries:
                if fields:  # a deleted row claimed back has no fields
                    rows.append(parse_row(shard, stream_id, fields))
        return rows

    async def ack(self, rows: list[OutboxRow]) -> None:
        """Acknowledge and delete published rows, one round trip for the batch."""
        by_shard: dict[int, list[str]] = {}
        for row in rows:
            shard, _, sid = row.stream_id.partition(":")
            by_shard.setdefault(int(shard), []).append(sid)
        async with self.redis.pipeline(transaction=False) as p:
            for shard, ids in by_shard.items():
                key = self.keys.outbox(shard)
                p.xack(key, RELAY_GROUP, *ids)
                p.xdel(key, *ids)
            await p.execute()

    async def claim_stale(
        self, shard: int, consumer: str, idle_ms: int, count: int
    ) -> list[OutboxRow]:
        """Take over rows another relay read but did not acknowledge for idle_ms."""
        key = self.keys.outbox(shard)
        try:
            reply = await self.redis.xautoclaim(
                key, RELAY_GROUP, consumer, min_idle_time=idle_ms, start_id="0-0", count=count
            )
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self.ensure_groups([shard])
            return []
        entries = reply[1]
        deleted = reply[2] if len(reply) > 2 else []
        if deleted:
            await self.redis.xack(key, RELAY_GROUP, *deleted)
        return [parse_row(shard, sid, f) for sid, f in entries if f]

    async def fire_timers(self, shard: int, limit: int, rearm_ms: int) -> int:
        """Turn due timers of a shard into outbox wake rows; returns how many fired."""
        prefix = f"{self.keys.ns}:{self.keys.tag(shard)}:s:"
        return int(
            await self.scripts.fire_timers(
                keys=[self.keys.timers(shard), self.keys.outbox(shard)],
                args=[limit, rearm_ms, prefix],
            )
        )

    async def next_timer_ms(self, shards: list[int]) -> int | None:
        """The earliest due time among these shards' timers."""
        async with self.redis.pipeline(transaction=False) as p:
            for s in shards:
                p.zrange(self.keys.timers(s), 0, 0, withscores=True)
            replies = await p.execute()
        due = [int(r[0][1]) for r in replies if r]
        return min(due) if due else None

    async def backlog(self) -> list[Backlog]:
        async with self.redis.pipeline(transaction=False) as p:
            for s in range(self.keys.shards):
                key = self.keys.outbox(s)
                p.xlen(key)
                p.xrange(key, "-", "+", count=1)
            replies = await p.execute()
        out = []
        for s in range(self.keys.shards):
            n, first = replies[2 * s], replies[2 * s + 1]
            oldest = int(first[0][0].split("-")[0]) if first else None
            out.append(Backlog(shard=s, rows=int(n), oldest_ms=oldest, pending=0))
        return out
