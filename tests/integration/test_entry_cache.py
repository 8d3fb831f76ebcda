"""A Brain's lease reads only the entries appended since its last one (the entry cache), and
the page it gets is the one a full read gives: after its own commits, after another Brain's
(a takeover), past the page size, and never from a session opened anew under the same id."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from baton.errors import LeaseBusyError
from baton.models import Entry, Task, WorkerRef
from baton.settings import Settings
from baton.store.entry_cache import CachedEntries, EntryCache
from baton.store.store import Store, worker_ref
from baton.store.writes import Writes
from tests.helpers import eventually

A = worker_ref("brain", "brain-a")
B = worker_ref("brain", "brain-b")
PAGE = 8


@pytest.fixture
async def cached(settings: Settings) -> AsyncIterator[Store]:
    store = await Store.connect(settings, entry_cache=EntryCache(1_000_000))
    try:
        yield store
    finally:
        await store.close()


async def _open(store: Store, sid: str) -> None:
    task = Task(id=f"task-{sid}", kind="generation", owner=sid, submission_id=f"sub-{sid}")
    await store.inbox.submit(sid, agent="notices", compat=1, wake_subject="wake.notices.1",
                             request_id=f"req-{sid}", text="hello", task=task,
                             worker=worker_ref("client", "c"), submission_id=f"sub-{sid}")


async def _opened(store: Store, sid: str, texts: list[str]) -> Any:
    """A session with ``texts`` as its entries; its lease (brain A's)."""
    await _open(store, sid)
    lease, _ = await store.acquire_and_load(sid, A, 60_000, page=PAGE)
    await _append(store, sid, lease.fence, texts)
    return lease


async def _append(store: Store, sid: str, fence: int, texts: list[str]) -> None:
    entries = [Entry(kind="model", text=t, task_id=f"task-{sid}") for t in texts]
    await store.commit(sid, fence, Writes(kind="history", entries=entries), A)


async def _taken(store: Store, sid: str, worker: WorkerRef, ttl_ms: int = 1) -> Any:
    """The lease and state of ``worker``, or None while another's lease is live."""
    try:
        return await store.acquire_and_load(sid, worker, ttl_ms, page=PAGE)
    except LeaseBusyError:
        return None


async def _page(store: Store, sid: str) -> list[str]:
    """The page a full read gives (no cache)."""
    return [e.text for e in (await store.load(sid, page=PAGE)).entries]


async def test_a_lease_reads_the_new_entries_and_gets_the_full_page(
    cached: Store, store: Store
) -> None:
    sid = "held-1"
    await _opened(cached, sid, ["hello"])
    lease, state = await cached.acquire_and_load(sid, A, 60_000, page=PAGE)  # holds "hello"
    await _append(cached, sid, lease.fence, ["one", "two", "three"])
    assert cached.entry_cache is not None
    before = cached.entry_cache.reused

    lease, state = await cached.acquire_and_load(sid, A, 60_000, page=PAGE)
    assert [e.text for e in state.entries] == await _page(store, sid)
    assert state.entries[0].text == "hello" and len(state.entries) == 4
    assert cached.entry_cache.reused - before == 1  # "hello" was not read again

    # past the page size: the newest PAGE entries, the older ones dropped
    await _append(cached, sid, lease.fence, [f"n{i}" for i in range(10)])
    lease, state = await cached.acquire_and_load(sid, A, 60_000, page=PAGE)
    assert [e.text for e in state.entries] == await _page(store, sid)
    assert state.entry_count == 14 and len(state.entries) == PAGE
    await _append(cached, sid, lease.fence, ["last"])
    _, state = await cached.acquire_and_load(sid, A, 60_000, page=PAGE)
    assert [e.text for e in state.entries] == await _page(store, sid)
    assert [e.text for e in state.entries][-2:] == ["n9", "last"]


async def test_entries_another_brain_appended_are_read(cached: Store, store: Store) -> None:
    """A takeover by another Brain, which appends, then a lease of the first again."""
    sid = "held-2"
    await _opened(cached, sid, ["hello"])
    lease, _ = await cached.acquire_and_load(sid, A, 1, page=PAGE)  # expires at once
    await _append(cached, sid, lease.fence, ["from a"])
    lease_b, _ = await eventually(lambda: _taken(store, sid, B), message="taken over by B")
    assert lease_b.fence > lease.fence
    await store.commit(sid, lease_b.fence, Writes(kind="history", entries=[
        Entry(kind="model", text="from b", task_id=f"task-{sid}")]), B)
    _, state = await eventually(lambda: _taken(cached, sid, A, 60_000), message="back to A")
    assert [e.text for e in state.entries] == ["hello", "from a", "from b"]
    assert [e.text for e in state.entries] == await _page(store, sid)


async def test_entries_held_for_another_life_of_the_session_are_not_used(
    cached: Store, store: Store
) -> None:
    """What is held belongs to the session opened at its ``created`` ms: entries held under
    another (a store that lost its state, the session opened again) are read anew."""
    sid = "held-3"
    await _opened(cached, sid, ["hello"])
    _, state = await cached.acquire_and_load(sid, A, 60_000, page=PAGE)
    assert cached.entry_cache is not None
    held = cached.entry_cache.get(sid)
    assert held is not None and (held.start, held.end) == (0, 1)
    # the same indices, another life: a stale "hello" must not be taken for this one's
    cached.entry_cache.put(sid, CachedEntries(held.created - 1, 0, ('{"v":1,"kind":"user",'
                                                                 '"text":"stale"}',)))
    before = cached.entry_cache.reused
    _, state = await cached.acquire_and_load(sid, A, 60_000, page=PAGE)
    assert [e.text for e in state.entries] == ["hello"] == await _page(store, sid)
    assert cached.entry_cache.reused == before
