"""Reading a session's state: the reads a load queues, and the :class:`SessionState` made
of their replies (the entries merged with those a Brain holds, see
:mod:`baton.store.entry_cache`).

The reads are the same whether a pipeline sends them (:func:`queue_load`, a MULTI/EXEC
snapshot) or acquire.lua makes them in its own call, whose reply lists the hashes as
field/value lists (:func:`as_pipeline_reads`).
"""

from __future__ import annotations

from typing import Any

from baton.errors import from_redis_error, not_found
from baton.models import Submission, Task, decode
from baton.store.documents import documents_from_hash
from baton.store.entry_cache import EntryCache
from baton.store.keys import SessionKeys
from baton.store.state import (
    Entries,
    SessionState,
    parse_decisions,
    parse_meta,
    parse_requests,
    parse_runs,
    requested_meta,
    with_intents,
)

__all__ = ["as_pipeline_reads", "queue_load", "session_state"]

_HASH_READS = (0, 1, 2, 3, 4, 8, 9)  # meta tasks docs subs runs .. intents inbox (queue_load)


def queue_load(p: Any, sk: SessionKeys, page: int) -> None:
    """Queue the reads of a load on pipeline ``p``: the live state and the newest ``page``
    entries."""
    p.hgetall(sk.meta).hgetall(sk.tasks).hgetall(sk.docs).hgetall(sk.subs)
    p.hgetall(sk.runs).llen(sk.entries).lrange(sk.entries, -page, -1).get(sk.nudge)
    p.hgetall(sk.intents).hgetall(sk.inbox)


def as_pipeline_reads(reads: list[Any]) -> list[Any]:
    """acquire.lua's state reads as a pipeline returns them: the hashes (field/value lists
    in a script's reply) as dicts."""
    out = list(reads)
    for i in _HASH_READS:
        it = iter(out[i])
        out[i] = dict(zip(it, it, strict=True))
    return out


def session_state(session_id: str, results: list[Any], *, namespace: str, role: str,
                  held: EntryCache | None = None, page: int = 0) -> SessionState:
    """The state of ``results`` (the reads of :func:`queue_load`). With ``held``, the
    entries are acquire.lua's for what that cache held, merged into a page of ``page``
    entries (and held in turn)."""
    for r in results:
        if isinstance(r, Exception):
            raise from_redis_error(r, session_id=session_id, role=role)
    meta, tasks, docs, subs, runs, count, entries, nudge, intents, inbox = results
    # A session not opened yet reads as its first waiting request asks (fence 0, nothing
    # committed): the Brain's acquire opens it before any commit.
    meta = meta or requested_meta(inbox)
    if not meta:
        raise not_found(f"session {session_id}", namespace=namespace, session_id=session_id)
    runs = with_intents(runs, intents)
    start, newest = int(count) - len(entries), entries
    if held is not None and page:
        start, newest = held.page(
            session_id, int(meta.get("created") or 0), int(count), entries, page)
    return SessionState(
        meta=parse_meta(session_id, meta, runs, nudge, inbox),
        tasks={k: decode(Task, v) for k, v in tasks.items()},
        documents=documents_from_hash(docs),
        submissions={k: decode(Submission, v) for k, v in subs.items()},
        runs=parse_runs(runs),
        entry_count=int(count),
        entries=Entries(newest, session_id=session_id, start=start),
        decisions=parse_decisions(inbox),
        requests=parse_requests(inbox),
    )
