"""The read models the API serves and the console draws, built on the command line's views.

Sessions are listed with :func:`baton.cli.inspect.session_rows` (the cluster view's own
classification), a session is :func:`baton.cli.inspect.session_view` plus its documents and
their retained versions, its timeline is :func:`baton.cli.trace.build_trace`, and workers are
the services' announcements with the (agent, compat level) pairs each Brain serves.
"""

from __future__ import annotations

from typing import Any

from baton.cli.findings import Findings
from baton.cli.inspect import newest_sessions, session_rows, session_view
from baton.cli.trace import build_trace
from baton.errors import ForbiddenError, not_found
from baton.models import Document, decode
from baton.store.deadletter import dead_letter_count, dead_letters
from baton.store.documents import DocumentDelta, documents_from_hash, read_document
from baton.store.quarantine import quarantine_of
from baton.store.redis_client import redis_user
from baton.store.store import Store, now_ms
from baton.store.workers import live_brains, served_levels, services

__all__ = [
    "SCAN_LIMIT", "dead_letter_page", "document_at", "list_sessions", "session_detail",
    "session_entries", "session_trace", "workers_view",
]

SCAN_LIMIT = 1_000  # newest sessions a filtered listing looks through


async def list_sessions(
    store: Store, *, status: str | None = None, agent: str | None = None,
    blocked: bool | None = None, quarantined: bool | None = None,
    since_ms: int | None = None, until_ms: int | None = None, limit: int = 50,
) -> dict[str, Any]:
    """The newest sessions that match every filter given (among the :data:`SCAN_LIMIT`
    newest created in the time range), with how many exist in that range."""
    now = now_ms()
    served = served_levels(await services(store.redis, store.keys, now))
    found = Findings()
    ids, total = await newest_sessions(store, SCAN_LIMIT, since_ms=since_ms, until_ms=until_ms,
                                       findings=found)
    if found.refused("sessions index"):
        # An empty list would read as "no sessions": the API's credential cannot list them.
        raise ForbiddenError(redis_user(store.settings), "read", "the sessions index",
                             "the API lists sessions with a credential that reads every "
                             "session (the operator's)")
    rows = await session_rows(store, ids, served, now, findings=found)
    picked = [r for r in rows
              if (status is None or r["state"] == status)
              and (agent is None or r["agent"] == agent)
              and (blocked is None or bool(r["blocked"]) == blocked)
              and (quarantined is None or r["quarantined"] == quarantined)]
    return {"total": total, "scanned": len(ids), "matched": len(picked),
            "sessions": picked[:limit], "findings": list(found)}


async def _exists(store: Store, session_id: str) -> None:
    if not await store.inbox.exists(session_id):
        raise not_found(f"session {session_id}", namespace=store.keys.ns, session_id=session_id)


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


async def session_detail(store: Store, session_id: str) -> dict[str, Any]:
    """``inspect SESSION`` as data, plus documents and the quarantine record (if any)."""
    await _exists(store, session_id)
    view = await session_view(store, session_id)
    fields: Any = await store.redis.hgetall(store.keys.session(session_id).docs)
    view["documents"] = _documents(fields)
    view["quarantine"] = await quarantine_of(store, session_id)
    return view


async def document_at(store: Store, session_id: str, name: str,
                      version: int | None = None) -> dict[str, Any]:
    """Document ``name`` as it was at ``version`` (default: the current one), rebuilt from its
    baseline and the deltas up to that version."""
    doc, head = await read_document(store, session_id, name, version)
    return {"name": name, "version": doc.version, "head": head, "updated_ms": doc.updated_ms,
            "value": doc.value}


async def session_entries(store: Store, session_id: str, start: int = 0,
                          limit: int = 200) -> dict[str, Any]:
    """Conversation entries ``start`` .. ``start + limit - 1`` (a negative start counts from
    the end), with their indexes and the total."""
    await _exists(store, session_id)
    sk = store.keys.session(session_id)
    total = int(await store.redis.llen(sk.entries))
    first = max(total + start, 0) if start < 0 else start
    entries = await store.entries(session_id, first, first + limit - 1) if limit > 0 else []
    return {"total": total, "start": first, "entries": [
        {"index": first + i, **e.model_dump(mode="json", exclude_none=True)}
        for i, e in enumerate(entries)]}


async def session_trace(store: Store, session_id: str) -> dict[str, Any]:
    """The handoff timeline (lanes, events, handoffs, runs, publishes) from the receipts."""
    await _exists(store, session_id)
    return build_trace(session_id, await store.receipts(session_id)).to_json()


async def dead_letter_page(store: Store, limit: int = 100) -> dict[str, Any]:
    return {"count": await dead_letter_count(store.redis, store.keys),
            "items": await dead_letters(store.redis, store.keys, limit)}


async def workers_view(store: Store) -> dict[str, Any]:
    """Every announced service, and per (agent, compat level) the live Brains serving it."""
    now = now_ms()
    announced = await services(store.redis, store.keys, now)
    announced.sort(key=lambda s: (s.get("role", ""), s.get("name", "")))
    levels = [{"agent": a, "compat": c, "brains": live_brains(announced, a, c)}
              for a, c in sorted(served_levels(announced))]
    return {"services": announced, "levels": levels}
