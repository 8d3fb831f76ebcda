"""The scripts issued in one event-loop turn (the Hands' claims and completions, the Brain's
leases and commits) share one round trip (store.batch), and each caller still gets its own
reply or its own error, as from a call of its own."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from baton.errors import StaleAttemptError, StaleFenceError, ToolMismatchError
from baton.models import Entry, Task, ToolIntent, ToolResult
from baton.store.store import Store, worker_ref
from baton.store.writes import Writes

BRAIN = worker_ref("brain", "b1")
HANDS = worker_ref("hands", "h1")
WAKE = "x.wake.notices.1"


async def _dispatched(store: Store, n: int) -> tuple[str, list[ToolIntent]]:
    sid = "sb-" + uuid.uuid4().hex[:10]
    task = Task(id=f"{sid}-root", kind="generation", owner=sid)
    await store.inbox.submit(sid, agent="notices", compat=1, wake_subject=WAKE, request_id="r",
                             text="hi", task=task, worker=worker_ref("client", "c"),
                             submission_id=f"{sid}-sub")
    lease, _ = await store.acquire_and_load(sid, BRAIN, 60_000)
    intents = [ToolIntent(run_id=f"g-{i}", session_id=sid, task_id=f"{sid}-root",
                          tool="send_email", operation_id=f"op-{i}", wake_subject=WAKE,
                          group="g") for i in range(n)]
    await store.commit(sid, lease.fence, Writes(runs=intents, groups={"g": n}), BRAIN)
    return sid, intents


def _ok(intent: ToolIntent, attempt: int) -> ToolResult:
    return ToolResult(outcome="ok", output={"sent": intent.run_id}, attempt=attempt)


async def test_claims_and_completes_of_one_turn_share_a_round_trip(store: Store) -> None:
    sid, intents = await _dispatched(store, 4)
    batch = store.batch
    before = batch.batches
    claims = await asyncio.gather(*(store.runs.claim(sid, i.run_id, HANDS) for i in intents))
    assert [c.status for c in claims] == ["claimed"] * 4
    assert [c.intent for c in claims] == intents
    assert batch.batches == before  # four claims of one session: one script call
    # One stale complete among good ones: only its caller is refused.
    results = await asyncio.gather(
        *(store.runs.complete(sid, i, c.attempt + (1 if n == 1 else 0),
                              _ok(i, c.attempt), HANDS)
          for n, (i, c) in enumerate(zip(intents, claims, strict=True))),
        return_exceptions=True)
    assert batch.batches == before  # and four completes of one session: one script call
    assert isinstance(results[1], StaleAttemptError)
    assert results[1].fields["current"] == claims[1].attempt
    assert results[0] is False and results[2] is False and results[3] is False
    # The group's last result wakes the Brain, alone or batched.
    assert await store.runs.complete(sid, intents[1], claims[1].attempt,
                                     _ok(intents[1], claims[1].attempt), HANDS) is True
    state = await store.load(sid)
    assert {r.status for r in state.runs.values()} == {"completed"}


async def test_a_group_completed_in_one_call_wakes_the_brain_once(store: Store) -> None:
    sid, intents = await _dispatched(store, 3)
    claims = await asyncio.gather(*(store.runs.claim(sid, i.run_id, HANDS) for i in intents))
    wakes = store.keys.wakes(store.keys.shard_of(sid))
    before = await store.redis.xlen(wakes)
    runner, calls = store.batch.runner, []
    run = runner.run

    async def counted(script: Any, *args: Any, **kw: Any) -> Any:
        calls.append(script)
        return await run(script, *args, **kw)

    runner.run = counted  # type: ignore[method-assign]
    woke = await asyncio.gather(*(store.runs.complete(sid, i, c.attempt, _ok(i, c.attempt), HANDS)
                                  for i, c in zip(intents, claims, strict=True)))
    assert calls == ["complete"]  # the three results: one complete.lua call
    assert woke == [False, False, True]  # the group's last result, in order, wakes it
    assert await store.redis.xlen(wakes) == before + 1  # one wake row for the group
    state = await store.load(sid)
    assert {r.status for r in state.runs.values()} == {"completed"}
    assert {rid: r.result for rid, r in state.runs.items()} == {
        i.run_id: _ok(i, c.attempt) for i, c in zip(intents, claims, strict=True)}


async def test_a_batch_after_the_server_lost_its_scripts_runs_each_once(
    store: Store,
) -> None:
    sid, intents = await _dispatched(store, 3)
    await store.redis.script_flush()  # as after a restart: NOSCRIPT for the batch
    claims = await asyncio.gather(*(store.runs.claim(sid, i.run_id, HANDS) for i in intents))
    assert [(c.status, c.attempt) for c in claims] == [("claimed", 1)] * 3
    run = await store.runs.get(sid, intents[0].run_id)
    assert run is not None and run.attempt == 1  # not claimed twice


async def test_a_caller_cancelled_while_batched_leaves_the_others_answered(
    store: Store,
) -> None:
    sid, intents = await _dispatched(store, 2)
    first = asyncio.ensure_future(store.runs.claim(sid, intents[0].run_id, HANDS))
    second = asyncio.ensure_future(store.runs.claim(sid, intents[1].run_id, HANDS))
    await asyncio.sleep(0)  # both queued in this turn
    first.cancel()
    assert (await second).status == "claimed"
    with pytest.raises(asyncio.CancelledError):
        await first


async def _opened(store: Store) -> str:
    sid = "sb-" + uuid.uuid4().hex[:10]
    await store.inbox.submit(sid, agent="notices", compat=1, wake_subject=WAKE, request_id="r",
                             text="hi", task=Task(id=f"{sid}-root", kind="generation", owner=sid),
                             worker=worker_ref("client", "c"), submission_id=f"{sid}-sub")
    return sid


async def test_leases_and_commits_of_one_turn_share_a_round_trip(store: Store) -> None:
    sids = [await _opened(store) for _ in range(3)]
    batch = store.batch
    before = batch.batches
    leased = await asyncio.gather(*(store.acquire_and_load(s, BRAIN, 60_000) for s in sids))
    assert batch.batches == before + 1  # three leases, one pipeline
    assert [st.requests[0].task.id for _, st in leased] == [f"{s}-root" for s in sids]
    # One commit under a stale fence among good ones: only its caller is refused.
    fences = [lease.fence + (1 if n == 1 else 0) for n, (lease, _) in enumerate(leased)]
    results = await asyncio.gather(
        *(store.commit(s, f, Writes(entries=[Entry(kind="system", text=s)]), BRAIN)
          for s, f in zip(sids, fences, strict=True)),
        return_exceptions=True)
    assert batch.batches == before + 2
    assert isinstance(results[1], StaleFenceError)
    assert results[0] == (1, 1) and results[2] == (1, 1)
    for n, s in enumerate(sids):
        state = await store.load(s)
        assert [e.text for e in state.entries] == ([] if n == 1 else [s])


async def _fcalls(store: Store) -> int:
    stats = await store.redis.info("commandstats")
    return int(stats.get("cmdstat_fcall", {}).get("calls", 0))


async def test_claims_of_one_session_in_one_turn_are_one_script_call(store: Store) -> None:
    """claim.lua takes the runs of one session a worker claims together: one call, each run
    fenced on its own, and a refusal of one (another tool) fails only its caller."""
    sid, intents = await _dispatched(store, 4)
    # on the server whatever an earlier test did to its functions (a FUNCTION FLUSH): a
    # "function not found" answer and the call again would be two calls
    await store.scripts.registered.claim.load()
    before = await _fcalls(store)
    claims = await asyncio.gather(
        *(store.runs.claim(sid, i.run_id, HANDS, tool="other" if n == 2 else "send_email")
          for n, i in enumerate(intents)), return_exceptions=True)
    assert await _fcalls(store) == before + 1
    assert isinstance(claims[2], ToolMismatchError)
    assert [c.status for n, c in enumerate(claims) if n != 2] == ["claimed"] * 3
    run = await store.runs.get(sid, intents[2].run_id)
    assert run is not None and run.attempt == 0  # the refused run was not touched
    # claimed again in one call (same worker): each gets its own next attempt fence
    again = await asyncio.gather(*(store.runs.claim(sid, i.run_id, HANDS) for i in intents))
    assert [c.attempt for c in again] == [2, 2, 1, 2]


async def test_a_lease_reads_its_state_with_plain_commands_after_its_script(
    store: Store,
) -> None:
    """On one server the lease's script only takes the lease (and checks the types of what
    is read after it); the state comes from plain commands sent right after it, in the same
    round trip: read by the script, every field cost the server twice as much."""
    sid, intents = await _dispatched(store, 2)
    assert store.batch.reads_natively
    redis = store.redis
    before = (await redis.config_get("slowlog-log-slower-than"))["slowlog-log-slower-than"]
    await redis.config_set("slowlog-log-slower-than", 0)  # log every command, with its caller
    try:
        await redis.slowlog_reset()
        batches = store.batch.batches
        lease, state = await store.acquire_and_load(sid, BRAIN, 60_000)
        log = await redis.slowlog_get(128)
    finally:
        await redis.config_set("slowlog-log-slower-than", before)
    assert store.batch.batches == batches + 1  # the script and its reads: one round trip
    # a command a script runs is logged with the Lua client's address, "?:0"
    reads = [e for e in log if bytes(e["command"]).split()[0] in (b"HGETALL", b"LRANGE")]
    assert len(reads) == 7 and all(bytes(e["client_address"]) != b"?:0" for e in reads), reads
    assert {r.run_id for r in state.runs.values()} == {i.run_id for i in intents}
    assert lease.fence == 2 and state.meta.fence == 2


async def test_a_lease_after_the_server_lost_its_scripts_takes_and_reads_once(
    store: Store,
) -> None:
    sid, intents = await _dispatched(store, 2)
    await store.redis.script_flush()  # as after a restart: NOSCRIPT for the lease
    lease, state = await store.acquire_and_load(sid, BRAIN, 60_000)
    assert lease.fence == 2 and state.meta.fence == 2  # taken once, read after it
    assert {r.run_id for r in state.runs.values()} == {i.run_id for i in intents}
    kinds = [r["kind"] for _, r in await store.redis.xrange(store.keys.session(sid).receipts)]
    # the first lease's and this one's (a takeover: the first was never released), no more
    assert kinds.count("lease") + kinds.count("takeover") == 2, kinds
