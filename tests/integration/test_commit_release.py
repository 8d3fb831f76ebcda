"""The pass's last commit releases the lease in its own script (commit.lua ``rl``), and the
acquire that reads the state in its script: against a real redis-server."""

from __future__ import annotations

import uuid

import pytest

from baton.errors import StaleFenceError
from baton.models import Entry, Task
from baton.store.store import Store, worker_ref
from baton.store.writes import Writes
from tests.helpers import take_up

BRAIN = worker_ref("brain", "brain-a")
BRAIN_B = worker_ref("brain", "brain-b")
WAKE = "t.wake.notices.1"
LEASE_MS = 60_000  # long: a second Brain gets in only because the lease was released


async def _session(store: Store) -> str:
    sid = "cr-" + uuid.uuid4().hex[:10]
    await store.inbox.submit(sid, agent="notices", compat=1, wake_subject=WAKE, request_id="r1",
                             text="hi", task=Task(id=f"{sid}-t", kind="generation", owner=sid),
                             worker=worker_ref("client", "c"), submission_id=f"{sid}-sub")
    await take_up(store, sid, BRAIN)
    return sid


def _writes() -> Writes:
    return Writes(kind="final", entries=[Entry(kind="model", text="done")], deadline_ms=-1,
                  release_ttl_ms=LEASE_MS)


async def test_a_clean_last_commit_releases_the_lease(store: Store) -> None:
    sid = await _session(store)
    lease, _ = await store.acquire_and_load(sid, BRAIN, LEASE_MS)
    seq, count, kept = await store.commit_and_release(sid, lease.fence, _writes(), BRAIN)
    assert not kept and seq >= 1 and count == 2  # the user entry and this one
    meta = await store.redis.hgetall(store.keys.session(sid).meta)
    assert meta["holder"] == "" and meta["lease_until"] == "0"
    # another Brain takes it at once, as after a release: a lease, not a takeover
    other, state = await store.acquire_and_load(sid, BRAIN_B, LEASE_MS)
    assert other.fence == lease.fence + 1 and not other.takeover
    assert [e.text for e in state.entries] == ["hi", "done"]


async def test_work_arrived_meanwhile_keeps_the_lease_for_another_look(store: Store) -> None:
    sid = await _session(store)
    lease, _ = await store.acquire_and_load(sid, BRAIN, 1_000)
    sk = store.keys.session(sid)
    await store.redis.set(sk.nudge, "1")  # a tool result or timer arrived during the pass
    _, _, kept = await store.commit_and_release(sid, lease.fence, _writes(), BRAIN)
    assert kept
    meta = await store.redis.hgetall(sk.meta)
    assert meta["holder"] == BRAIN.name and meta["dirty"] == "0"
    assert int(meta["lease_until"]) > 0 and not await store.redis.exists(sk.nudge)
    assert not await store.release(sid, lease.fence, LEASE_MS)  # nothing more: released


async def test_a_stale_last_commit_releases_nothing(store: Store) -> None:
    sid = await _session(store)
    lease, _ = await store.acquire_and_load(sid, BRAIN, LEASE_MS)
    await store.redis.hset(store.keys.session(sid).meta, "lease_until", 0)  # it expired
    newer, _ = await store.acquire_and_load(sid, BRAIN_B, LEASE_MS)  # takes over
    with pytest.raises(StaleFenceError):
        await store.commit_and_release(sid, lease.fence, _writes(), BRAIN)
    meta = await store.redis.hgetall(store.keys.session(sid).meta)
    assert meta["holder"] == BRAIN_B.name and int(meta["fence"]) == newer.fence


async def test_the_acquire_reads_what_a_load_reads(store: Store) -> None:
    sid = await _session(store)
    lease, state = await store.acquire_and_load(sid, BRAIN, LEASE_MS)
    loaded = await store.load(sid)
    assert state.meta == loaded.meta and state.meta.fence == lease.fence
    assert state.tasks == loaded.tasks and state.submissions == loaded.submissions
    assert state.runs == loaded.runs and state.documents == loaded.documents
    assert list(state.entries) == list(loaded.entries) and state.entry_count == 1


async def test_a_handover_releases_at_once_and_marks_the_fence_that_handed_over(
    store: Store,
) -> None:
    """A Brain stopping mid-pass hands the session over (release.lua's handover): released
    even though work arrived meanwhile, the next Brain leases it at once (no takeover) and
    reads which fence handed it over; a stale handover changes nothing."""
    sid = await _session(store)
    lease, _ = await store.acquire_and_load(sid, BRAIN, LEASE_MS)
    sk = store.keys.session(sid)
    await store.redis.set(sk.nudge, "1")  # a tool result arrived during the pass
    await store.hand_over(sid, lease.fence)
    meta = await store.redis.hgetall(sk.meta)
    assert meta["holder"] == "" and meta["lease_until"] == "0"
    assert meta["handed"] == str(lease.fence)
    other, state = await store.acquire_and_load(sid, BRAIN_B, LEASE_MS)
    assert other.fence == lease.fence + 1 and not other.takeover
    assert state.meta.handed_over(lease.fence) and not state.meta.handed_over(other.fence)
    assert not await store.redis.exists(sk.nudge)  # the new lease took up what arrived
    before = await store.redis.hgetall(sk.meta)
    with pytest.raises(StaleFenceError):
        await store.hand_over(sid, lease.fence)
    assert await store.redis.hgetall(sk.meta) == before
