"""Who writes what of a tool run: the Brain decides in its intents hash, the Hands record
attempts and results in the runs hash, and neither writes the other's.

The Brain's commit dispatches runs, counts the results a group awaits, cancels runs never
claimed and applies results without writing the runs hash (its ACL user may only read it);
the records of applied runs are named for the Hands, who drop them on their next result, so
the runs hash a Brain loads stays as small as the live work.
"""

from __future__ import annotations

import uuid

from baton.models import Task, ToolIntent, ToolResult, decode
from baton.settings import Settings
from baton.store.store import Store, worker_ref
from baton.store.writes import Writes

BRAIN = worker_ref("brain", "b1")
HANDS = worker_ref("hands", "h1")
WAKE = "x.wake.notices.1"


async def _session(store: Store) -> tuple[str, int]:
    sid = "rr-" + uuid.uuid4().hex[:10]
    task = Task(id=f"{sid}-root", kind="generation", owner=sid)
    await store.inbox.submit(sid, agent="notices", compat=1, wake_subject=WAKE, request_id="r",
                             text="hi", task=task, worker=worker_ref("client", "c"),
                             submission_id=f"{sid}-sub")
    lease, _ = await store.acquire_and_load(sid, BRAIN, 60_000)
    return sid, lease.fence


def _intent(sid: str, rid: str, group: str) -> ToolIntent:
    return ToolIntent(run_id=rid, session_id=sid, task_id=f"{sid}-root", tool="send_email",
                      operation_id=f"op-{rid}", wake_subject=WAKE, group=group)


async def _dispatch(store: Store, sid: str, fence: int, group: str, n: int) -> list[ToolIntent]:
    intents = [_intent(sid, f"{group}-{i}", group) for i in range(n)]
    await store.commit(sid, fence, Writes(runs=intents, groups={group: n}), BRAIN)
    return intents


async def _run(store: Store, sid: str, intent: ToolIntent) -> bool:
    claim = await store.runs.claim(sid, intent.run_id, HANDS)
    assert claim.status == "claimed"
    result = ToolResult(outcome="ok", output={"sent": intent.run_id}, attempt=claim.attempt)
    return await store.runs.complete(sid, intent, claim.attempt, result, HANDS)


async def test_a_group_wakes_once_its_last_result_is_in_and_applied_records_are_dropped(
    settings: Settings,
) -> None:
    store = await Store.connect(settings)
    try:
        sid, fence = await _session(store)
        sk = store.keys.session(sid)
        first = await _dispatch(store, sid, fence, "g1", 3)
        assert not await store.redis.exists(sk.runs)  # the dispatch wrote only the intents
        state = await store.load(sid)
        assert state.meta.groups == {"g1": 3}
        assert {r.status for r in state.runs.values()} == {"dispatched"}
        woke = [await _run(store, sid, i) for i in first]
        assert woke == [False, False, True]  # only the group's last result wakes the Brain
        state = await store.load(sid)
        assert state.meta.groups == {} and {r.status for r in state.runs.values()} == {
            "completed"}
        await store.commit(sid, fence, Writes(applied=[i.run_id for i in first]), BRAIN)
        done = await store.runs.applied(sid)
        assert {r: done[r].result.output for r in done} == {  # type: ignore[union-attr]
            i.run_id: {"sent": i.run_id} for i in first}
        assert all(done[i.run_id].applied_ms for i in first)
        assert (await store.load(sid)).runs == {}
        # The Hands' records of the applied runs wait for the Hands' next result.
        assert await store.redis.hlen(sk.runs) > 0
        second = await _dispatch(store, sid, fence, "g2", 1)
        assert await _run(store, sid, second[0])
        left = await store.redis.hkeys(sk.runs)
        fields = ("status", "attempt", "worker", "heartbeat", "accepted", "result",
                  "completed", "attempts")
        assert sorted(left) == sorted([*(f"g2-0.{f}" for f in fields), "grp:g2"])
        assert not await store.redis.hexists(sk.intents, "grp:g1")
    finally:
        await store.close()


async def test_a_run_cancelled_before_any_claim_ends_in_the_brains_own_records(
    settings: Settings,
) -> None:
    store = await Store.connect(settings)
    try:
        sid, fence = await _session(store)
        sk = store.keys.session(sid)
        runs = await _dispatch(store, sid, fence, "g", 2)
        cancelled = ToolResult(outcome="cancelled", error="stopped")
        await store.commit(sid, fence, Writes(cancel_runs=[runs[0].run_id],
                                              cancel_result=cancelled.to_json()), BRAIN)
        assert not await store.redis.exists(sk.runs)
        claim = await store.runs.claim(sid, runs[0].run_id, HANDS)
        assert (claim.status, claim.previous_status) == ("done", "completed")
        state = await store.load(sid)
        ended = state.runs[runs[0].run_id]
        assert ended.status == "completed" and ended.cancel_ms is not None
        assert ended.result == cancelled
        assert state.meta.groups == {"g": 1}
        assert await _run(store, sid, runs[1])  # the group's last awaited result wakes
        await store.commit(sid, fence, Writes(applied=[r.run_id for r in runs]), BRAIN)
        done = await store.runs.applied(sid)
        assert done[runs[0].run_id].result == cancelled
        assert decode(ToolResult, await store.redis.hget(  # type: ignore[arg-type]
            sk.runs_done, f"{runs[1].run_id}.result")).outcome == "ok"
    finally:
        await store.close()


async def test_a_claim_of_an_applied_run_is_done_and_of_an_unknown_one_gone(
    settings: Settings,
) -> None:
    """claim looks for an applied run only when the intents hash has no intent for it: the
    commit that applies a run moves its intent to runs_done in the same step."""
    store = await Store.connect(settings)
    try:
        sid, fence = await _session(store)
        sk = store.keys.session(sid)
        [intent] = await _dispatch(store, sid, fence, "g1", 1)
        assert await _run(store, sid, intent)
        await store.commit(sid, fence, Writes(applied=[intent.run_id]), BRAIN)
        receipts = await store.redis.xlen(sk.receipts)
        claim = await store.runs.claim(sid, intent.run_id, HANDS)
        assert (claim.status, claim.previous_status) == ("done", "applied")
        assert (await store.runs.claim(sid, "no-such-run", HANDS)).status == "gone"
        assert await store.redis.xlen(sk.receipts) == receipts  # neither wrote anything
    finally:
        await store.close()
