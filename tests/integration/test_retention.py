"""Settled sessions leave Redis for the archive, and a new submission brings them back
(baton.store.retention), against real Redis and NATS servers, a real archive directory and
the Brain, Hands and relay in this event loop.

Retention is a fraction of a second here, so the relay fires the retention timer soon after
the final commit; the tests wait on the session's keys, never on a duration.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from baton.archive import Archive, ArchivedSession, decode
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.errors import ArchivedError, NotFoundError
from baton.examples.notices import app
from baton.models import Terminal, WorkerRef
from baton.receipts import id_order
from baton.settings import Settings
from baton.store import retention
from baton.store.store import Store
from baton.store.writes import Writes
from tests.helpers import eventually, running, take_up, trio
from tests.integration.confinement import Confined

FIVE = ("Send the approved notice to ada@example.com, grace@example.com, linus@example.com, "
        "margaret@example.com and barbara@example.com, then summarise.")
STALE = WorkerRef(role="brain", name="brain-stale", pid=0)


@pytest.fixture
def archiving(settings: Settings, mailbox: MailboxServer, tmp_path: Path) -> Settings:
    return settings.model_copy(update={
        "mail_url": mailbox.url, "session_retention_s": 0.3,
        "archive_url": str(tmp_path / "archive")})


async def session_keys(store: Store, session_id: str, redis: Any = None) -> list[str]:
    """Every key of the session left in Redis (the tombstone apart), read with ``redis``
    (one allowed to SCAN; the store's own by default)."""
    redis = store.redis if redis is None else redis
    pattern = store.keys.session(session_id).meta.removesuffix("meta") + "*"
    return sorted(k for k in [k async for k in redis.scan_iter(match=pattern)]
                  if not k.endswith(":archived"))


async def archived(store: Store, session_id: str) -> bool:
    return bool(await retention.tombstone(store, session_id)) and not await session_keys(
        store, session_id)


async def settle_and_archive(client: Client) -> Any:
    """A five-notice session submitted, settled and archived (the services running)."""
    sub, _ = await client.submit(FIVE, agent="notices")
    await client.wait(sub, timeout=30)
    await eventually(lambda: archived(client.store, sub.session_id), timeout=30,
                     message="the session archived")
    return sub


def archived_receipts(snap: ArchivedSession) -> list[tuple[str, str]]:
    """The receipts an archive object holds, as (role, id), merged in order."""
    streams = (("brain", snap.receipts), ("hands", snap.receipts_hands),
               ("client", snap.receipts_client))
    return sorted(((role, rid) for role, stream in streams for rid, _ in stream),
                  key=lambda r: id_order(r[1]))


async def deliveries(mailbox: MailboxServer) -> dict[str, int]:
    async with httpx.AsyncClient() as http:
        stats: dict[str, Any] = (await http.get(f"{mailbox.url}/stats")).json()
    return dict(stats["deliveries"])


async def test_a_settled_session_leaves_redis_for_one_archive_object(
        archiving: Settings, mailbox: MailboxServer) -> None:
    async with running(*trio(archiving, app)):
        client = await Client.connect(archiving)
        try:
            sub, _ = await client.submit(FIVE, agent="notices")
            final = await client.wait(sub, timeout=30)
            receipts = await client.store.receipts(sub.session_id)
            await eventually(lambda: archived(client.store, sub.session_id), timeout=30,
                             message="the session archived")
            tomb = await retention.tombstone(client.store, sub.session_id)
        finally:
            await client.close()
    assert final.status == "completed"
    archive = Archive.from_url(archiving.archive_location())
    data = await archive.get(archiving.namespace, sub.session_id)
    assert data is not None
    snap = decode(data)
    # Everything the trace, inspect and the API need, as Redis held it.
    assert snap.subs[sub.id] and '"completed"' in snap.subs[sub.id]
    # every role's receipts, each in its own stream: the Brains', the Hands', the client's
    assert archived_receipts(snap)[:len(receipts)] == [(r.stream_role, r.stream_id)
                                                       for r in receipts]
    assert {role for role, _ in archived_receipts(snap)} == {"brain", "hands", "client"}
    assert snap.entries and snap.meta["agent"] == "notices"
    assert tomb["status"] == "completed" and int(tomb["fence"]) == snap.fence
    assert sorted((await deliveries(mailbox)).values()) == [1] * 5


async def test_late_writes_to_an_archived_session_are_refused_and_write_nothing(
        archiving: Settings) -> None:
    async with running(*trio(archiving, app)):
        client = await Client.connect(archiving)
        try:
            sub = await settle_and_archive(client)
            store, sid = client.store, sub.session_id
            tomb = await retention.tombstone(store, sid)
            # A stale Brain that held the lease before the archival, a lease for a late
            # wake, a Hands' late result, a heartbeat: each refused, nothing written.
            with pytest.raises(ArchivedError):
                await store.commit(sid, int(tomb["fence"]), Writes(kind="note"), STALE)
            with pytest.raises(ArchivedError):
                await store.acquire(sid, STALE, 5000)
            with pytest.raises(ArchivedError):
                await store.release(sid, int(tomb["fence"]), 5000)
            assert await session_keys(store, sid) == []
            assert await retention.tombstone(store, sid) == tomb
        finally:
            await client.close()


async def test_a_new_submission_restores_the_session_once_and_continues_it(
        archiving: Settings, mailbox: MailboxServer) -> None:
    """Two clients submit to the archived session at once: one restore, both answered, the
    trace joins the archived history (the archived receipts, then 'restored', then the
    new ones)."""
    long = archiving.model_copy(update={"session_retention_s": 3600.0})
    async with running(*trio(archiving, app)):
        client = await Client.connect(archiving)
        try:
            sub = await settle_and_archive(client)
        finally:
            await client.close()
    before = decode(await Archive.from_url(archiving.archive_location()).get(
        archiving.namespace, sub.session_id) or b"")
    async with running(*trio(long, app)):
        first, second = await Client.connect(long), await Client.connect(long)
        try:
            (a, _), (b, _) = await asyncio.gather(
                first.submit(FIVE, agent="notices", session_id=sub.session_id,
                             request_id="again-1"),
                second.submit(FIVE, agent="notices", session_id=sub.session_id,
                              request_id="again-2"))
            done = await asyncio.gather(first.wait(a, timeout=30), second.wait(b, timeout=30))
            # The first request id still answers its original, settled submission.
            original, created = await first.submit(
                FIVE, agent="notices", session_id=sub.session_id, request_id=sub.request_id)
            receipts = await first.store.receipts(sub.session_id)
        finally:
            await first.close()
            await second.close()
    assert [d.status for d in done] == ["completed", "completed"]
    assert not created and original.id == sub.id and original.status == "completed"
    kinds = [r.kind for r in receipts]
    assert kinds.count("restored") == 1
    restored_at = kinds.index("restored")
    assert [(r.stream_role, r.stream_id) for r in receipts[:restored_at]] == \
        archived_receipts(before)
    assert sorted((await deliveries(mailbox)).values()) == [3] * 5  # once per submission


async def test_a_session_whose_tombstone_expired_is_restored_from_the_archive(
        archiving: Settings, mailbox: MailboxServer) -> None:
    """The tombstone outlives its TTL: Redis holds nothing of the session. A submission to
    it used to open a new session under the old id, its history cut off; now the client
    finds the session in the archive, a Brain writes the tombstone back and restores it, and
    the conversation goes on where it stopped."""
    short = archiving.model_copy(update={"tombstone_ttl_s": 0.5})
    long = archiving.model_copy(update={"session_retention_s": 3600.0})
    async with running(*trio(short, app)):
        client = await Client.connect(short)
        try:
            sub = await settle_and_archive(client)
            sid = sub.session_id
            await eventually(lambda: _gone(client.store, sid), timeout=30,
                             message="the tombstone expired")
        finally:
            await client.close()
    before = decode(await Archive.from_url(archiving.archive_location()).get(
        archiving.namespace, sid) or b"")
    async with running(*trio(long, app)):
        client = await Client.connect(long)
        try:
            again, created = await client.submit(FIVE, agent="notices", session_id=sid,
                                                 request_id="again")
            final = await client.wait(again, timeout=30)
            # the first request id still answers the original, archived submission
            original, first_created = await client.submit(
                FIVE, agent="notices", session_id=sid, request_id=sub.request_id)
            receipts = await client.store.receipts(sid)
            state = await client.store.load(sid)
        finally:
            await client.close()
    assert created and final.status == "completed"
    assert not first_created and original.id == sub.id and original.status == "completed"
    kinds = [r.kind for r in receipts]
    assert kinds.count("restored") == 1
    assert [(r.stream_role, r.stream_id) for r in receipts[:kinds.index("restored")]] == \
        archived_receipts(before)
    assert state.meta.fence > before.fence  # past the archived fence: stale workers stay out
    assert sorted((await deliveries(mailbox)).values()) == [2] * 5


async def _gone(store: Store, sid: str) -> bool:
    return not await retention.tombstone(store, sid) and not await session_keys(store, sid)


async def test_a_restore_request_the_archive_cannot_answer_is_dropped(
        archiving: Settings) -> None:
    """A restore request for a session neither Redis nor the archive holds (the archive's
    lifecycle rule pruned it): the Brain drops the request instead of keeping an inbox that
    wakes Brains for ever, and a plain submission then opens a new session."""
    async with running(*trio(archiving, app)):
        client = await Client.connect(archiving)
        try:
            store, sid = client.store, "s-pruned-from-archive"
            wake = client.names.wake_subject("notices", 1)
            assert await retention.ask_restore(store, sid, wake)
            await eventually(lambda: _gone(store, sid), timeout=30,
                             message="the orphaned restore request dropped")
            sub, created = await client.submit(FIVE, agent="notices", session_id=sid)
            final = await client.wait(sub, timeout=30)
        finally:
            await client.close()
    assert created and final.status == "completed"


async def test_each_role_does_its_part_of_archival_and_restore_under_its_own_acl(
        confined: Confined, tmp_path: Path) -> None:
    """With the deploy ACL users: the client submits, a Brain settles the session and
    archives it, the Hands' late result and the client's next request are refused ARCHIVED
    with nothing written, the client asks for a restore and a Brain restores it."""
    archive = Archive.from_url(str(tmp_path / "archive"))
    stores = {role: await Store.connect(confined.settings(role).model_copy(
        update={"session_retention_s": 0.001})) for role in ("client", "brain", "hands")}
    client, brain, hands = stores["client"], stores["brain"], stores["hands"]
    sid = "acme-archived"
    me = WorkerRef(role="brain", name="brain-1", pid=0)
    admin = confined.connect("admin")
    try:
        sub = await submit(client, sid, "r-1")
        await take_up(brain, sid, me)
        lease, state = await brain.acquire_and_load(sid, me, 5000)
        task = next(iter(state.tasks.values()))
        done_task = task.model_copy(update={"state": Terminal(outcome="completed")})
        await brain.commit(sid, lease.fence, Writes(
            kind="final", tasks=[done_task], deadline_ms=-1, retain_ms=1,
            submissions=[state.submissions[sub.id].model_copy(update={
                "status": "completed", "answer": "ok", "settled_ms": 1})]), me)
        await eventually(lambda: retention.archive_if_due(brain, archive, sid, lease.fence,
                                                          me), message="archived")
        assert await session_keys(brain, sid, admin) == []
        with pytest.raises(ArchivedError):  # a late result of the Hands
            await hands.runs.heartbeat(sid, "r-late", 1, me)
        with pytest.raises(ArchivedError):  # a request goes through a restore
            await submit(client, sid, "r-2")
        assert await session_keys(brain, sid, admin) == []
        assert await retention.ask_restore(client, sid)
        assert await retention.restore(brain, archive, sid, me)
        assert not await retention.restore(brain, archive, sid, me)  # once
        assert not await retention.ask_restore(client, sid)
        again = await submit(client, sid, "r-2")
        assert again.session_id == sid
        restored = await brain.load(sid)
        assert (await brain.inbox.submission(sid, sub.id)).status == "completed"
        assert restored.meta.fence == lease.fence + 1
        # Archived again, and its tombstone gone (expired): the client's probe finds no
        # session, the client asks with the object's wake subject, the Brain writes the
        # tombstone back and restores it; each under its own ACL.
        await take_up(brain, sid, me)
        lease, state = await brain.acquire_and_load(sid, me, 5000)
        task = next(iter(state.tasks.values()))
        await brain.commit(sid, lease.fence, Writes(
            kind="final", tasks=[task.model_copy(update={
                "state": Terminal(outcome="completed")})], deadline_ms=-1, retain_ms=1,
            submissions=[state.submissions[again.id].model_copy(update={
                "status": "completed", "answer": "ok", "settled_ms": 1})]), me)
        await eventually(lambda: retention.archive_if_due(brain, archive, sid, lease.fence,
                                                          me), message="archived again")
        await admin.delete(brain.keys.session(sid).archived)  # as when it expires
        with pytest.raises(NotFoundError):
            await submit(client, sid, "r-3", probe=True)
        wake = f"{client.keys.ns}.wake.notices.1"
        assert await retention.ask_restore(client, sid, wake)
        assert await retention.reinstate(brain, archive, sid)
        assert await retention.restore(brain, archive, sid, me)
        assert (await brain.load(sid)).meta.fence == lease.fence + 1
    finally:
        await admin.aclose()
        for store in stores.values():
            await store.close()


async def submit(store: Store, sid: str, request: str, *, probe: bool = False) -> Any:
    from baton.client.input import GENERATION
    from baton.models import Task

    task = Task(id=f"gen-{request}", kind=GENERATION, owner=sid, submission_id=f"sub-{request}",
                input={"agent": "notices"}, created_ms=1)
    sub, _ = await store.inbox.submit(
        sid, agent="notices", compat=1, wake_subject=f"{store.keys.ns}.wake.notices.1",
        request_id=request, text="hello", task=task, submission_id=f"sub-{request}",
        worker=WorkerRef(role="client", name="client-1", pid=0), probe=probe)
    return sub


async def test_a_client_asking_back_a_session_being_archived_gets_it_restored(
        archiving: Settings, mailbox: MailboxServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client submits to the session just archived, while the Brain that archived it is
    still finishing that pass (writing the archive's index row): the client's wake joins that
    pass (acked, as a joined wake is), and its repeated asks carry the same message id, so no
    other wake comes. The pass looks again after its archival, finds the client's request,
    and restores the session; the submission settles."""
    index_written, go_on = asyncio.Event(), asyncio.Event()
    put_index = Archive.put_index

    async def held_put_index(self: Archive, namespace: str, rows: Any) -> list[str]:
        index_written.set()  # archive.lua ran: the tombstone is there, the pass goes on
        await go_on.wait()
        return await put_index(self, namespace, rows)

    monkeypatch.setattr(Archive, "put_index", held_put_index)
    relay, hands, brain = trio(archiving, app)
    async with running(relay, hands, brain):
        client = await Client.connect(archiving)
        try:
            sub, _ = await client.submit(FIVE, agent="notices")
            await client.wait(sub, timeout=30)
            sid = sub.session_id
            await eventually(index_written.is_set, timeout=30,
                             message="the Brain archiving the session")
            assert await archived(client.store, sid) and sid in brain.active
            again = asyncio.ensure_future(client.submit(
                FIVE, agent="notices", session_id=sid, request_id="again"))
            await eventually(lambda: brain.active[sid].rewake, timeout=30,
                             message="the client's wake joined the archiving pass")
            go_on.set()
            more, _ = await again
            final = await client.wait(more, timeout=30)
            receipts = await client.store.receipts(sid)
        finally:
            go_on.set()
            await client.close()
    assert final.status == "completed"
    assert [r.kind for r in receipts].count("restored") == 1
