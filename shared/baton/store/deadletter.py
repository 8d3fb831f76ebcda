"""Dead letters: messages that can never be handled, kept with their reason for ``inspect``.

A poison message (an outbox row NATS refuses, a wake or tool message that does not decode)
must neither block what comes behind it nor vanish: the worker that gives up on it appends
one record to a dead-letter stream and then acknowledges the message. The records are
split over the shards (``<ns>:{<ns>-N}:dead:<role>``, by the session the message is about, or
its id), so a flood of poison messages on a Redis Cluster does not pile onto one slot, and
by the role that recorded them (relay, brain, hands), so a role's credential can append to
and trim only its own; readers merge every shard's and role's newest records. A role keeps
at most :data:`MAX_RECORDS` in the namespace: each of its shard streams is trimmed by the
XADD that appends to it, exactly, to its share (:func:`shard_cap`), so the bound does not
grow with the number of shards. A payload is kept up to :data:`PAYLOAD_LIMIT` bytes and a
reason up to :data:`REASON_LIMIT` characters: a role's records take at most about
``MAX_RECORDS x 8 kB`` (80 MB) of Redis (7.5 kB each measured, the largest ones).

Recording happens before the acknowledgement, so a crash in between can record the same
message twice; that is harmless (dead letters are for people to read, not work to redo).
"""

from __future__ import annotations

import time
from typing import Any

from redis.asyncio import Redis

from baton.observability.log import bounded
from baton.store.keys import Keys
from baton.store.store import now_ms

__all__ = ["MAX_RECORDS", "PAYLOAD_LIMIT", "dead_letter_count", "dead_letters",
           "record_dead_letter", "shard_cap"]

MAX_RECORDS = 10_000  # per role, over every shard of the namespace
PAYLOAD_LIMIT = 4 * 1024
REASON_LIMIT = 2_000  # characters of the reason kept (it may quote the refused input)


def shard_cap(shards: int) -> int:
    """How many records one shard's stream of a role keeps: its share of :data:`MAX_RECORDS`
    (rounded up). Trimmed exactly: an approximate trim keeps whole stream nodes of up to
    100 records, which over thousands of shards would keep far more than the share."""
    return -(-MAX_RECORDS // shards)


def _text(value: str | bytes, limit: int | None = None) -> str:
    raw = value.encode() if isinstance(value, str) else bytes(value)
    if limit is not None:
        raw = raw[:limit]
    return raw.decode(errors="replace")


async def record_dead_letter(
    redis: Redis, keys: Keys, *, role: str, source: str, reason: str, payload: str | bytes,
    **fields: Any,
) -> str:
    """Append a dead letter to ``role``'s stream (each role writes only its own); extra
    ``fields`` are stored as strings. Returns the record id."""
    size = len(payload.encode() if isinstance(payload, str) else payload)
    record: dict[str, str] = {
        **{k: _text(v) if isinstance(v, bytes) else str(v) for k, v in fields.items()},
        "source": source,
        "reason": bounded(reason, REASON_LIMIT),
        "payload": _text(payload, PAYLOAD_LIMIT),
        "size": str(size),
        "ts": str(now_ms()),
        # Orders records of different shards written within one millisecond.
        "at_us": str(time.time_ns() // 1000),
    }
    about = record.get("session_id") or record.get("row_id") or record.get("msg_id") or reason
    record_id = await redis.xadd(keys.dead(about, role), record,  # type: ignore[arg-type]
                                 maxlen=shard_cap(keys.shards), approximate=False)
    return _text(record_id)


def _newest_first(record: dict[str, str]) -> tuple[int, int, int]:
    ms, _, seq = record["id"].partition("-")
    return int(ms or 0), int(record.get("at_us") or 0), int(seq or 0)


async def dead_letters(redis: Redis, keys: Keys, count: int = 100) -> list[dict[str, str]]:
    """The newest ``count`` dead letters of every shard, newest first, each with its
    record ``id``."""
    async with redis.pipeline(transaction=False) as p:
        for key in keys.every("dead"):
            p.xrevrange(key, count=count)
        replies: Any = await p.execute()
    out = []
    for records in replies:
        for record_id, record in records:
            out.append({"id": _text(record_id),
                        **{_text(k): _text(v) for k, v in record.items()}})
    out.sort(key=_newest_first, reverse=True)
    return out[:count]


async def dead_letter_count(redis: Redis, keys: Keys) -> int:
    """How many dead letters are kept, over every shard."""
    async with redis.pipeline(transaction=False) as p:
        for key in keys.every("dead"):
            p.xlen(key)
        return sum(int(n) for n in await p.execute())
