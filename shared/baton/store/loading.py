"""Reading a session's state: the reads a load queues, and the :class:`SessionState` made
of their replies (the entries merged with those a Brain cached, see
:mod:`baton.store.entry_cache`).

The reads are the same whether a pipeline sends them (:func:`queue_load`, a MULTI/EXEC
snapshot), a lease sends them as plain commands right after its script (:func:`lease_reads`:
the way a lease reads on one server), or acquire.lua makes them in its own call, whose reply
lists the hashes as field/value lists (:func:`as_pipeline_reads`).

A load reads the session's open submissions from meta (its ``sub:<id>`` fields, see
commit.lua), never the subs hash, which keeps every submission the session ever had: a
lease costs the same after a thousand settled submissions as after one. A live task whose
submission is not there (a session committed before meta held them) has it read from the
subs hash by :func:`missing_submissions`.
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

__all__ = ["as_native_reads", "as_pipeline_reads", "lease_reads", "missing_submissions",
           "open_submissions", "queue_load", "session_state", "tail_is_read"]

_HASH_READS = (0, 1, 2, 3, 7, 8)  # meta tasks docs runs .. intents inbox (queue_load)
#: Meta's fields holding the open submissions (commit.lua): ``sub:<submission id>``.
OPEN_SUBMISSION = "sub:"


def queue_load(p: Any, sk: SessionKeys, page: int) -> None:
    """Queue the reads of a load on pipeline ``p``: the live state and the newest ``page``
    entries."""
    p.hgetall(sk.meta).hgetall(sk.tasks).hgetall(sk.docs)
    p.hgetall(sk.runs).llen(sk.entries).lrange(sk.entries, -page, -1).get(sk.nudge)
    p.hgetall(sk.intents).hgetall(sk.inbox)


def lease_reads(sk: SessionKeys, page: int, cached_end: int | None) -> list[tuple[Any, ...]]:
    """The reads of :func:`queue_load` as commands (but the nudge's: the lease deletes it),
    sent right after acquire.lua called with page -1, with the entries read from
    ``cached_end`` (the index a Brain cached them up to, see :mod:`baton.store.entry_cache`)
    when it cached some: at most ``page`` of them, which :func:`tail_is_read` checks once the
    count is in.

    Read by the Lua script, every field of the state is a Lua string made from the reply and
    a reply made from that string again: plain reads after the script cost the server about
    half as much. They see the lease and whatever others wrote since (a tool result, a
    client's request: each also leaves the nudge, which sends the Brain round once more), as
    the reads after a replicated lease do; what only the lease holder writes (meta, tasks,
    entries, intents) cannot change under them."""
    first, last = (-page, -1) if cached_end is None else (cached_end, cached_end + page - 1)
    return [("HGETALL", sk.meta), ("HGETALL", sk.tasks), ("HGETALL", sk.docs),
            ("HGETALL", sk.runs), ("LLEN", sk.entries), ("LRANGE", sk.entries, first, last),
            ("HGETALL", sk.intents), ("HGETALL", sk.inbox)]


def tail_is_read(reads: list[Any], page: int, cached_end: int, cached_created: int) -> bool:
    """Whether the entries :func:`lease_reads` read from ``cached_end`` (in ``reads``, as
    :func:`as_native_reads` gives them) are the session's last
    ones, all of them, and of the life the cached ones came from (as acquire.lua decides before
    it reads): else the newest page is to be read instead."""
    meta, count = reads[0], reads[4]
    if isinstance(meta, Exception) or isinstance(count, Exception):
        return True  # the error is what session_state reports
    created = (meta or {}).get("created")
    return (str(cached_created) == str(created or "") and cached_end <= int(count)
            and int(count) - cached_end <= page)


def as_native_reads(reads: list[Any]) -> list[Any]:
    """:func:`lease_reads`' results as :func:`queue_load`'s: the nudge, which the lease (or
    the release or commit that kept it) has just deleted, as none, and the hashes as dicts
    (a RESP2 connection gives their field/value lists)."""
    return _hashes_as_dicts([*reads[:6], None, *reads[6:]])


def as_pipeline_reads(reads: list[Any]) -> list[Any]:
    """acquire.lua's state reads as a pipeline returns them: the hashes (field/value lists
    in a script's reply) as dicts."""
    return _hashes_as_dicts(list(reads))


def _hashes_as_dicts(out: list[Any]) -> list[Any]:
    """``out`` with the hash reads that are field/value lists made dicts, in place."""
    for i in _HASH_READS:
        if isinstance(out[i], list):
            it = iter(out[i])
            out[i] = dict(zip(it, it, strict=True))
    return out


def session_state(session_id: str, results: list[Any], *, namespace: str, role: str,
                  cache: EntryCache | None = None, page: int = 0) -> SessionState:
    """The state of ``results`` (the reads of :func:`queue_load`). With ``cache``, the
    entries are acquire.lua's for what that cache had, merged into a page of ``page``
    entries (and cached in turn)."""
    for r in results:
        if isinstance(r, Exception):
            raise from_redis_error(r, session_id=session_id, role=role)
    meta, tasks, docs, runs, count, entries, nudge, intents, inbox = results
    # A session not opened yet reads as its first waiting request asks (fence 0, nothing
    # committed): the Brain's acquire opens it before any commit.
    meta = meta or requested_meta(inbox)
    if not meta:
        raise not_found(f"session {session_id}", namespace=namespace, session_id=session_id)
    runs = with_intents(runs, intents)
    live = {k: decode(Task, v) for k, v in tasks.items()}
    start, newest = int(count) - len(entries), entries
    if cache is not None and page:
        start, newest = cache.page(
            session_id, int(meta.get("created") or 0), int(count), entries, page)
    return SessionState(
        meta=parse_meta(session_id, meta, runs, nudge, inbox),
        tasks=live,
        documents=documents_from_hash(docs),
        submissions=open_submissions(meta, live),
        runs=parse_runs(runs),
        entry_count=int(count),
        entries=Entries(newest, session_id=session_id, start=start),
        decisions=parse_decisions(inbox),
        requests=parse_requests(inbox),
    )


def open_submissions(meta: dict[str, str], tasks: dict[str, Task]) -> dict[str, Submission]:
    """The open submissions meta holds (``sub:<id>``, see commit.lua) whose task is live: a
    copy a Brain of an earlier version left behind when it settled the submission (it wrote
    the subs hash only) has no live task, and is not the session's state."""
    out = {}
    for k, v in meta.items():
        if k.startswith(OPEN_SUBMISSION):
            sub = decode(Submission, v)
            if sub.task_id in tasks:
                out[sub.id] = sub
    return out


def missing_submissions(state: SessionState) -> list[str]:
    """The submissions of ``state``'s live tasks that meta does not hold, sorted: a session
    whose open submissions a Brain of an earlier version committed (the subs hash only). The
    store reads them from the subs hash (:meth:`~baton.store.store.Store.acquire_and_load`);
    none for a session committed by this version."""
    return sorted({t.submission_id for t in state.tasks.values()
                   if t.submission_id and t.submission_id not in state.submissions})
