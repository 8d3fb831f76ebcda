"""A settled session's life after its work: kept for a while, archived, restored on demand.

Redis holds live work only (DESIGN.md section 12). The commit that leaves a session with
nothing live (no open task: the Brain's ``deadline_ms < 0``) arms its retention
(commit.lua ``rt``): meta ``retain_at``, on Redis' clock, and a ``retain`` timer that wakes a
Brain then. That Brain's lease finds the session idle, and :func:`archive_if_due`:

1. reads ``retain_at`` and Redis' clock: not due, nothing more (one round trip);
2. reads every key of the session in one MULTI (:func:`baton.archive.snapshot`) while it
   holds the lease, and writes that as one object to the archive (:class:`baton.archive.
   Archive`), which confirms the write;
3. runs ``archive.lua`` under its fence: the session must still be the snapshot (meta seq
   and the newest receipt of each role's stream unchanged), settled, and due; then its keys
   are deleted and a small tombstone written, all in that one script (see its header).

A crash between 2 and 3 leaves the session live in Redis and an object in the archive that a
later archival overwrites: nothing is lost, nothing is half-archived.

While the tombstone is there every session script refuses the session with ARCHIVED
(:class:`~baton.errors.ArchivedError`): a late wake, tool result, heartbeat or stale worker
writes nothing. A client's submission to it is refused too, and asks for a restore
(:func:`ask_restore`, ``ask_restore.lua``: a ``restore`` request in the inbox, and a wake); the
Brain whose lease is refused ARCHIVED with a request waiting calls :func:`restore`
(``restore.lua``: the keys written back, exactly once however many Brains race, the fence
past the archived one), then leases the session as usual; the client submits again.
"""

from __future__ import annotations

from typing import Any

import orjson

from baton.archive import Archive, ArchivedSession, IndexRow, decode, encode, snapshot
from baton.errors import BatonError, CorruptStateError, from_redis_error
from baton.models import WorkerRef
from baton.observability.log import get_logger
from baton.store.redis_client import REDIS_ERRORS, is_cluster
from baton.store.runs import worker_json
from baton.store.scripts import declared
from baton.store.store import Store

__all__ = ["archive_if_due", "ask_restore", "reinstate", "restore", "restore_keys",
           "tombstone"]

log = get_logger("baton.store.retention")

#: The hash families of a session, as archive objects keep them and restore.lua takes them.
_HASHES = ("meta", "tasks", "done", "docs", "subs", "reqs", "runs_done", "intents", "poison",
           "inbox")


def _redis_ms(time_reply: Any) -> int:
    sec, usec = time_reply
    return int(sec) * 1000 + int(usec) // 1000


async def archive_if_due(store: Store, archive: Archive, session_id: str, fence: int,
                         worker: WorkerRef) -> bool:
    """Archive the session when its retention has passed; True when it left Redis.

    The caller holds the session's lease (``fence``) and found it idle. Raises
    :class:`~baton.errors.NotArchivable` when it changed or woke meanwhile (nothing written
    in Redis), :class:`~baton.errors.StaleFenceError` when the lease was lost, and the
    archive's error when the object could not be written (the session stays as it is).
    """
    sk = store.keys.session(session_id)
    try:
        cluster: Any = store.redis
        if is_cluster(cluster):  # TIME has no key: asked of the session's own node
            retain_at = await cluster.hget(sk.meta, "retain_at")
            clock = await cluster.time(target_nodes=cluster.get_node_from_key(sk.meta))
        else:
            async with store.redis.pipeline(transaction=False) as p:
                p.hget(sk.meta, "retain_at")
                p.time()
                retain_at, clock = await p.execute()
    except REDIS_ERRORS as exc:
        raise from_redis_error(exc, session_id=session_id) from None
    if not retain_at or int(retain_at) > _redis_ms(clock):
        return False
    snap = await snapshot(store.redis, sk, namespace=store.keys.ns, fence=fence)
    key = await archive.put(store.keys.ns, session_id, encode(snap))
    settings = store.settings
    ttl_ms = round(settings.tombstone_ttl_s * 1000)
    await store.scripts.run("archive", sk, [
        fence, worker.name, session_id, str(snap.seq), snap.last_receipts(), key, ttl_ms,
        snap.summary.status, snap.summary.submissions, ttl_ms])
    try:  # the listing of archived sessions by time (Archive.list_index); best effort
        await archive.put_index(store.keys.ns, [IndexRow.of(snap)])
    except BatonError as exc:
        log.warning("archive_index_failed", session_id=session_id, error=str(exc))
    log.info("session_archived", session_id=session_id, object=key, fence=fence,
             entries=len(snap.entries),
             receipts=len(snap.receipts) + len(snap.receipts_hands) + len(snap.receipts_client))
    return True


async def tombstone(store: Store, session_id: str) -> dict[str, str]:
    """The session's tombstone (``{}`` when it is not archived, or its tombstone expired)."""
    try:
        found: dict[str, str] = await store.redis.hgetall(  # type: ignore[assignment]
            store.keys.session(session_id).archived)  # decode_responses: str
    except REDIS_ERRORS as exc:
        raise from_redis_error(exc, session_id=session_id) from None
    return found


def restore_keys(snap: ArchivedSession) -> str:
    """The keys of an archive object as restore.lua takes them (ARGV[4]): hashes as flat
    field/value lists (but the Hands' runs records, see restore.lua), the entries, each
    role's receipts as ``[id, [field, value, ...]]``."""
    keys: dict[str, Any] = {}
    for name in _HASHES:
        pairs: list[str] = []
        for field, value in getattr(snap, name).items():
            pairs += (field, value)
        keys[name] = pairs
    keys["entries"] = list(snap.entries)
    for name in ("receipts", "receipts_hands", "receipts_client"):
        keys[name] = [[rid, [x for kv in fields.items() for x in kv]]
                      for rid, fields in getattr(snap, name)]
    return orjson.dumps(keys).decode()


async def restore(store: Store, archive: Archive, session_id: str, worker: WorkerRef) -> bool:
    """Bring the archived session back into Redis; True when this call restored it, False
    when there was nothing to restore (another Brain did, or it is not archived).

    Raises :class:`~baton.errors.CorruptStateError` when the tombstone names an object the
    archive no longer has or cannot decode (the session stays archived: an operator must
    look), and the archive's error when it is unreachable (retried by the next wake)."""
    sk = store.keys.session(session_id)
    tomb = await tombstone(store, session_id)
    if not tomb:
        return False
    data = await archive.get(store.keys.ns, session_id)
    if data is None:
        raise CorruptStateError(session_id, f"its archive object "
                                f"{Archive.session_key(store.keys.ns, session_id)} is "
                                "missing from the archive")
    snap = decode(data)
    receipt = orjson.dumps({"detail": {"archived_ms": int(tomb.get("at", 0) or 0),
                                       "object": Archive.session_key(store.keys.ns,
                                                                     session_id)}}).decode()
    try:
        done, fence = await store.scripts.registered.restore(
            keys=declared("restore", sk),
            args=[worker.name, worker_json(worker), tomb.get("at", ""), restore_keys(snap),
                  receipt, store.keys.settled_channel(session_id)])
    except REDIS_ERRORS as exc:
        raise from_redis_error(exc, session_id=session_id) from None
    if done:
        log.info("session_restored", session_id=session_id, fence=fence,
                 archived_ms=tomb.get("at"), entries=len(snap.entries))
    return bool(done)


async def ask_restore(store: Store, session_id: str, wake: str = "") -> bool:
    """A client's request that a Brain restore the archived session (ask_restore.lua);
    False when it is not archived (any more): submit again at once. ``wake``: the wake
    subject of its archive object, when its tombstone expired (the Brain then writes it
    back first: :func:`reinstate`)."""
    sk = store.keys.session(session_id)
    try:
        asked = await store.scripts.registered.ask_restore(keys=declared("ask_restore", sk),
                                                           args=[session_id, wake])
    except REDIS_ERRORS as exc:
        raise from_redis_error(exc, session_id=session_id) from None
    return bool(asked)


async def reinstate(store: Store, archive: Archive, session_id: str) -> bool:
    """Write back the tombstone of an archived session whose tombstone expired, from its
    archive object, when a client's restore request waits for it (reinstate.lua); True when
    the caller should lease the session again (the tombstone is written, by this call or
    another Brain's, or the session is back already): it then restores it (:func:`restore`).

    A request whose session the archive does not hold either (an archive pruned by its
    lifecycle rule, or a client mistaken) is dropped, so it does not wake Brains again, and
    False is returned."""
    sk = store.keys.session(session_id)
    data = await archive.get(store.keys.ns, session_id)
    if data is None:
        try:
            async with store.redis.pipeline(transaction=True) as p:
                p.hdel(sk.inbox, "restore")
                p.hlen(sk.inbox)
                _, left = await p.execute()
            if not left:
                await store.redis.delete(sk.nudge)
        except REDIS_ERRORS as exc:
            raise from_redis_error(exc, session_id=session_id) from None
        log.warning("restore_request_dropped", session_id=session_id,
                    reason="neither a tombstone nor an archive object")
        return False
    snap = decode(data)
    settings = store.settings
    ttl_ms = round(settings.tombstone_ttl_s * 1000)
    try:
        written = await store.scripts.registered.reinstate(keys=declared("reinstate", sk), args=[
            snap.archived_ms, snap.fence, snap.seq, snap.meta.get("agent", ""),
            snap.meta.get("compat", "1"), snap.meta.get("wake", ""),
            snap.meta.get("created", "0"), snap.summary.status, snap.summary.submissions,
            ttl_ms])
    except REDIS_ERRORS as exc:
        raise from_redis_error(exc, session_id=session_id) from None
    if written:
        log.info("tombstone_reinstated", session_id=session_id, fence=snap.fence,
                 archived_ms=snap.archived_ms)
    return True
