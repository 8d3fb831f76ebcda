"""Dead letters: messages that can never be handled, kept with their reason for ``inspect``.

A poison message (an outbox row NATS refuses, a wake or tool message that does not decode)
must neither block what comes behind it nor vanish: the worker that gives up on it appends
one record to the namespace's ``<ns>:dead`` stream and then acknowledges the message. The
stream is capped (approximately) at :data:`MAX_RECORDS`; a payload is kept up to
:data:`PAYLOAD_LIMIT` bytes.

Recording happens before the acknowledgement, so a crash in between can record the same
message twice; that is harmless (dead letters are for people to read, not work to redo).
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from baton.store.keys import Keys
from baton.store.store import now_ms

__all__ = ["MAX_RECORDS", "PAYLOAD_LIMIT", "dead_letters", "record_dead_letter"]

MAX_RECORDS = 10_000
PAYLOAD_LIMIT = 4 * 1024


def _text(value: str | bytes, limit: int | None = None) -> str:
    raw = value.encode() if isinstance(value, str) else bytes(value)
    if limit is not None:
        raw = raw[:limit]
    return raw.decode(errors="replace")


async def record_dead_letter(
    redis: Redis, keys: Keys, *, source: str, reason: str, payload: str | bytes, **fields: Any
) -> str:
    """Append a dead letter; extra ``fields`` are stored as strings. Returns the record id."""
    size = len(payload.encode() if isinstance(payload, str) else payload)
    record: dict[str, str] = {
        **{k: _text(v) if isinstance(v, bytes) else str(v) for k, v in fields.items()},
        "source": source,
        "reason": reason,
        "payload": _text(payload, PAYLOAD_LIMIT),
        "size": str(size),
        "ts": str(now_ms()),
    }
    record_id = await redis.xadd(keys.dead, record, maxlen=MAX_RECORDS, approximate=True)  # type: ignore[arg-type]
    return _text(record_id)


async def dead_letters(redis: Redis, keys: Keys, count: int = 100) -> list[dict[str, str]]:
    """The newest ``count`` dead letters, newest first, each with its record ``id``."""
    records: Any = await redis.xrevrange(keys.dead, count=count)
    out = []
    for record_id, record in records:
        out.append({"id": _text(record_id), **{_text(k): _text(v) for k, v in record.items()}})
    return out
