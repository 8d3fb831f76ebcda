"""The read models the API serves and the console draws, built on the command line's views.

Sessions are listed with :func:`baton.cli.inspect.session_rows` (the cluster view's own
classification), a session is :func:`baton.cli.inspect.session_view` plus its documents and
their retained versions, its timeline is :func:`baton.cli.trace.build_trace`, and workers are
the services' announcements with the (agent, compat level) pairs each Brain serves.

An archived session is read from the archive (:mod:`baton.store.archived`) and shown as it was,
marked: every view of a session carries ``archived`` (a bool) and ``archived_ms`` (when, or
null). The session list has them too (state ``archived``): those archived within
``tombstone_ttl_s`` from their tombstones in Redis, older ones from the archive's index when
the listing asks for archived sessions only (:func:`list_sessions`).
"""

from __future__ import annotations

from typing import Any

from baton.cli.findings import Findings
from baton.cli.inspect import limits_view, newest_sessions, session_rows, session_view
from baton.cli.trace import build_trace
from baton.errors import ForbiddenError
from baton.models import Document, decode
from baton.store.admission import AdmissionQueue
from baton.store.archived import ArchivedListing, ArchivedReads, ArchivedRow, SessionSource
from baton.store.deadletter import dead_letter_count, dead_letters
from baton.store.documents import DocumentDelta, documents_from_hash, read_document
from baton.store.quarantine import quarantine_of
from baton.store.redis_client import redis_user
from baton.store.store import Store, now_ms
from baton.store.workers import live_brains, served_levels, services

__all__ = [
    "ARCHIVED_STATUSES", "LIVE_STATES", "SCAN_LIMIT", "dead_letter_page", "document_at",
    "list_sessions", "session_detail", "session_entries", "session_trace", "workers_view",
]

SCAN_LIMIT = 1_000  # newest sessions a filtered listing looks through
#: The states of a live session in the list (:func:`baton.cli.inspect.session_rows`).
LIVE_STATES = ("blocked", "leased", "pending", "failed", "settled")
#: The statuses of an archived session's newest submission a listing filters by.
ARCHIVED_STATUSES = ("completed", "failed", "cancelled")


async def list_sessions(
    store: Store, reads: ArchivedReads, *, status: str | None = None,
    agent: str | None = None, blocked: bool | None = None, quarantined: bool | None = None,
    since_ms: int | None = None, until_ms: int | None = None, limit: int = 50,
    archived: bool | None = None,
) -> dict[str, Any]:
    """The newest sessions that match every filter given: the live ones first (among the
    :data:`SCAN_LIMIT` newest created in the time range), then the archived ones (newest
    archival first, archived in the time range).

    ``status``: a live session's state (:data:`LIVE_STATES`), ``archived`` (the archived
    sessions), or a submission status (:data:`ARCHIVED_STATUSES`), which an archived session
    matches by its newest submission (``failed`` matches live sessions too). ``archived``:
    True for the archived sessions only, False for the live ones only. The archived sessions
    whose tombstones are in Redis are always listed (no object is read); when the listing
    asks for archived sessions only (``archived=true``, ``status=archived``, ``completed`` or
    ``cancelled``) older ones are listed from the archive's index too, archived within
    ``since_ms``..``until_ms`` (a day before the tombstones' window without ``since_ms``;
    ``index_range`` says which archival times were read). ``total`` counts the live
    sessions created in the range, ``archived_total`` the archived ones whose tombstones
    Redis holds."""
    only_archived = archived is True or status in ("archived", "completed", "cancelled")
    with_live = archived is not True and not only_archived
    with_archived = archived is not False and blocked is not True and quarantined is not True \
        and status not in ("blocked", "leased", "pending", "settled")
    found = Findings()
    picked: list[dict[str, Any]] = []
    ids: list[str] = []
    total = 0
    if with_live:
        now = now_ms()
        served = served_levels(await services(store.redis, store.keys, now))
        ids, total = await newest_sessions(store, SCAN_LIMIT, since_ms=since_ms,
                                           until_ms=until_ms, findings=found)
        if found.refused("sessions index"):
            # An empty list would read as "no sessions": the credential cannot list them.
            raise ForbiddenError(redis_user(store.settings), "read", "the sessions index",
                                 "the API lists sessions with a credential that reads every "
                                 "session (the operator's)")
        rows = await session_rows(store, ids, served, now, findings=found)
        picked = [{**r, "archived": False, "archived_ms": None} for r in rows
                  if (status is None or r["state"] == status)
                  and (agent is None or r["agent"] == agent)
                  and (blocked is None or bool(r["blocked"]) == blocked)
                  and (quarantined is None or r["quarantined"] == quarantined)]
    listing = ArchivedListing([], 0)
    if with_archived and len(picked) < limit:
        listing = await reads.listing(
            since_ms=since_ms, until_ms=until_ms, agent=agent,
            status=status if status in ARCHIVED_STATUSES else None,
            limit=limit - len(picked), from_archive=only_archived)
    elif with_archived:  # the page is full of live ones: only how many are archived
        listing = await reads.listing(since_ms=since_ms, until_ms=until_ms, limit=0)
    picked += [_archived_row(r) for r in listing.rows]
    return {"total": total, "scanned": len(ids), "matched": len(picked),
            "sessions": picked[:limit], "archived_total": listing.in_redis,
            "index_range": list(listing.index_range) if listing.index_range else None,
            "findings": list(found)}


def _archived_row(r: ArchivedRow) -> dict[str, Any]:
    """An archived session as a row of the list: a live row's fields (what the archived
    session had: no holder, nothing blocked), its newest submission's status and how many
    submissions it had (by status only while live), when it was created and archived."""
    return {"session_id": r.session_id, "state": "archived", "fence": r.fence,
            "holder": None, "seq": r.seq, "agent": r.agent, "compat": r.compat,
            "blocked": None, "submissions": {}, "quarantined": False, "quarantine": None,
            "archived": True, "archived_ms": r.archived_ms, "status": r.status or None,
            "submission_count": r.submissions, "created_ms": r.created_ms or None}


async def _located(store: Store, reads: ArchivedReads, session_id: str) -> SessionSource:
    """Where the session's keys are: Redis while it holds them (or a request for it), else
    the archive; NotFoundError when neither has it."""
    if await store.inbox.exists(session_id):
        return SessionSource(store)
    return await reads.require(session_id)


def _documents(fields: dict[str, str]) -> list[dict[str, Any]]:
    """Each document's current value and the versions its hash can still rebuild."""
    current = documents_from_hash(fields)
    out = []
    for name, doc in sorted(current.items()):
        kept = sorted({doc.version} | {
            decode(DocumentDelta, raw).version for key, raw in fields.items()
            if key.startswith(f"{name}@") and not key.endswith("@b")} | {
            decode(Document, raw).version for key, raw in fields.items() if key == f"{name}@b"})
        out.append({"name": name, "version": doc.version, "updated_ms": doc.updated_ms,
                    "value": doc.value, "versions": [v for v in kept if v <= doc.version]})
    return out


async def session_detail(store: Store, reads: ArchivedReads,
                         session_id: str) -> dict[str, Any]:
    """``inspect SESSION`` as data, plus documents and the quarantine record (if any)."""
    source = await _located(store, reads, session_id)
    view = await session_view(store, session_id, source=source)
    fields: Any = await source.redis.hgetall(store.keys.session(session_id).docs)
    view["documents"] = _documents(fields)
    view["quarantine"] = await quarantine_of(source.store, session_id)
    return view


async def document_at(reads: ArchivedReads, session_id: str, name: str,
                      version: int | None = None) -> dict[str, Any]:
    """Document ``name`` as it was at ``version`` (default: the current one), rebuilt from its
    baseline and the deltas up to that version."""
    async def read(source: SessionSource) -> dict[str, Any]:
        doc, head = await read_document(source.store, session_id, name, version)
        return {"name": name, "version": doc.version, "head": head,
                "updated_ms": doc.updated_ms, "value": doc.value, **source.marker()}

    return await reads.read(session_id, read)


async def session_entries(store: Store, reads: ArchivedReads, session_id: str, start: int = 0,
                          limit: int = 200) -> dict[str, Any]:
    """Conversation entries ``start`` .. ``start + limit - 1`` (a negative start counts from
    the end), with their indexes and the total."""
    source = await _located(store, reads, session_id)
    sk = store.keys.session(session_id)
    total = int(await source.redis.llen(sk.entries))
    first = max(total + start, 0) if start < 0 else start
    entries = (await source.store.entries(session_id, first, first + limit - 1)
               if limit > 0 else [])
    return {"total": total, "start": first, "entries": [
        {"index": first + i, **e.model_dump(mode="json", exclude_none=True)}
        for i, e in enumerate(entries)], **source.marker()}


async def session_trace(store: Store, reads: ArchivedReads, session_id: str) -> dict[str, Any]:
    """The handoff timeline (lanes, events, handoffs, runs, publishes) from the receipts."""
    source = await _located(store, reads, session_id)
    return build_trace(session_id, await source.store.receipts(session_id),
                       archived_ms=source.marker()["archived_ms"]).to_json()


async def dead_letter_page(store: Store, limit: int = 100) -> dict[str, Any]:
    return {"count": await dead_letter_count(store.redis, store.keys),
            "items": await dead_letters(store.redis, store.keys, limit)}


async def admission_view(store: Store) -> dict[str, Any]:
    """The fair admission of new sessions (baton.store.admission): its settings and the
    sessions waiting to start, per tenant; and the fleet-wide limits of tools and models,
    with their slots in use and lines by tenant, and their rates' next admissions."""
    s = store.settings
    backlog = await AdmissionQueue(store.redis, store.keys, s).backlog()
    return {"enabled": s.admission_window > 0, "window": s.admission_window,
            "max_waiting": s.max_waiting, "max_waiting_per_tenant": s.max_waiting_per_tenant,
            "waiting": backlog.waiting, "starting": backlog.starting, "queued": backlog.queued,
            "tenants": [{"tenant": t, "waiting": n} for t, n in backlog.tenants.items()],
            **await limits_view(store)}


async def workers_view(store: Store) -> dict[str, Any]:
    """Every announced service, and per (agent, compat level) the live Brains serving it."""
    now = now_ms()
    announced = await services(store.redis, store.keys, now)
    announced.sort(key=lambda s: (s.get("role", ""), s.get("name", "")))
    levels = [{"agent": a, "compat": c, "brains": live_brains(announced, a, c)}
              for a, c in sorted(served_levels(announced))]
    return {"services": announced, "levels": levels}
