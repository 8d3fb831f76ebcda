"""``Client.wait`` and the settled notification (:mod:`baton.store.notices`) against a real
redis-server: the commit that settles a submission announces its record, so a waiting client
returns that record without reading it back; a notice that does not carry it (an id from an
older Brain, another submission's record) only wakes the waiter, which then reads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from baton.client import Client
from baton.models import Submission
from baton.settings import Settings
from baton.store.notices import settled_notice
from baton.store.store import Store, worker_ref
from baton.store.writes import Writes
from tests.helpers import eventually, take_up

BRAIN = worker_ref("brain", "brain-n")


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[Client]:
    c = await Client.connect(settings)
    try:
        yield c
    finally:
        await c.close()


def counted_reads(client: Client) -> list[Submission | None]:
    """What each of the client's submission reads returned, appended once it returned."""
    reads: list[Submission | None] = []
    read = client.store.inbox.taken_up

    async def counted(*args: Any, **kw: Any) -> Submission | None:
        found = await read(*args, **kw)
        reads.append(found)
        return found

    client.store.inbox.taken_up = counted  # type: ignore[method-assign]
    return reads


async def settle(store: Store, sub: Submission, notice: str) -> Submission:
    """A Brain's final commit: ``sub`` completed, announced with ``notice``."""
    lease = await store.acquire(sub.session_id, BRAIN, 5000)
    done = sub.model_copy(update={"status": "completed", "answer": "all sent",
                                  "settled_ms": 1})
    await store.commit(sub.session_id, lease.fence, Writes(
        kind="final", submissions=[done],
        notify=[(store.keys.settled_channel(sub.session_id), notice)]), BRAIN)
    await store.release(sub.session_id, lease.fence, 5000)
    return done


async def waiting(client: Client, session: str, request: str
                  ) -> tuple[Submission, asyncio.Task[Submission], list[Submission | None]]:
    """A submission taken up by a Brain, and a wait on it that has read it unsettled."""
    sub, _ = await client.submit("hi", agent="notices", session_id=session, request_id=request)
    await take_up(client.store, session, BRAIN)
    reads = counted_reads(client)
    task = asyncio.create_task(client.wait(sub, timeout=30))
    await eventually(lambda: reads, message="the waiter's first read")
    assert reads[0] is not None and not reads[0].settled
    return sub, task, reads


async def test_wait_returns_the_record_its_settling_commit_announced(
        client: Client, store: Store) -> None:
    sub, task, reads = await waiting(client, "n-1", "r-1")
    committed = await settle(store, sub, settled_notice(
        sub.model_copy(update={"status": "completed", "answer": "all sent", "settled_ms": 1})))
    final = await task
    assert final == committed == await store.inbox.submission("n-1", sub.id)
    assert len(reads) == 1 and client.notifications == 1  # no read after the notice


async def test_a_notice_without_the_record_makes_the_waiter_read(
        client: Client, store: Store) -> None:
    sub, task, reads = await waiting(client, "n-2", "r-2")
    committed = await settle(store, sub, sub.id)  # as a Brain before notices carried it
    assert await task == committed
    assert len(reads) == 2 and reads[1] == committed


async def test_another_submissions_record_only_wakes_the_waiter(
        client: Client, store: Store) -> None:
    sub, task, reads = await waiting(client, "n-3", "r-3")
    other = sub.model_copy(update={"id": "sub-other", "request_id": "r-other",
                                   "status": "completed", "settled_ms": 1})
    lease = await store.acquire("n-3", BRAIN, 5000)
    await store.commit("n-3", lease.fence, Writes(kind="note", notify=[(
        store.keys.settled_channel("n-3"), settled_notice(other))]), BRAIN)
    await store.release("n-3", lease.fence, 5000)
    await eventually(lambda: len(reads) == 2, message="a read after the other's notice")
    assert not task.done() and reads[1] is not None and not reads[1].settled
    committed = await settle(store, sub, settled_notice(
        sub.model_copy(update={"status": "completed", "answer": "all sent", "settled_ms": 1})))
    assert await task == committed and len(reads) == 2


async def test_a_wait_that_hears_its_notice_never_falls_back(
        client: Client, store: Store) -> None:
    """The defect redis-py 8.2 brought (its single-server PubSub gained a
    ``get_sharded_message``, and the listener took the cluster's reader): the notice was
    never heard and every wait took its one-second fallback. The wait ends on the notice."""
    sub, task, reads = await waiting(client, "n-4", "r-4")
    await settle(store, sub, settled_notice(
        sub.model_copy(update={"status": "completed", "answer": "all sent", "settled_ms": 1})))
    await task
    assert client.notifications == 1 and client.wait_fallbacks == 0 and len(reads) == 1


async def test_a_missed_notice_is_counted_and_warned_once_per_process(
        client: Client, store: Store, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A settling commit whose notice nobody hears (here: none is sent) ends the wait by its
    fallback re-read: counted each time, warned of the first time only."""
    import baton.client.reads

    monkeypatch.setattr(baton.client.reads, "_missed_warned", False)
    for n in (1, 2):
        sub, task, _ = await waiting(client, f"n-miss-{n}", f"r-miss-{n}")
        lease = await store.acquire(sub.session_id, BRAIN, 5000)
        done = sub.model_copy(update={"status": "completed", "answer": "ok", "settled_ms": 1})
        await store.commit(sub.session_id, lease.fence,
                           Writes(kind="final", submissions=[done]), BRAIN)  # no notify
        await store.release(sub.session_id, lease.fence, 5000)
        assert (await task).settled
        assert client.wait_fallbacks == n and client.notifications == 0
    warned = [r for r in caplog.records if r.getMessage().startswith("settled_notification_missed")
              or getattr(r, "event", None) == "settled_notification_missed"]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
