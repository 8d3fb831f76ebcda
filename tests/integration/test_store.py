"""The fenced session store against a real redis-server: atomicity, fencing, idempotency."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from baton.client import Client
from baton.devkit.servers import RedisServer, free_port
from baton.errors import (
    ConflictError,
    LeaseBusyError,
    NotFoundError,
    RedisUnavailable,
    StaleAttemptError,
    StaleFenceError,
    ValidationError,
    WaitTimeout,
)
from baton.models import Entry, OutboxRow, Task, Terminal, ToolIntent, ToolResult, Waiting
from baton.settings import Settings
from baton.store.outbox import Outbox
from baton.store.scripts import declared
from baton.store.store import Store, now_ms, worker_ref
from baton.store.writes import Writes
from tests.helpers import eventually, take_up

BRAIN = worker_ref("brain", "brain-a")
BRAIN_B = worker_ref("brain", "brain-b")
HANDS = worker_ref("hands", "hands-a")
HANDS_B = worker_ref("hands", "hands-b")
WAKE = "t.wake.notices.1"


@pytest.fixture
async def store(settings: Settings):
    s = await Store.connect(settings.model_copy(update={"lease_ms": 300, "attempt_ttl_ms": 300}))
    yield s
    await s.close()


async def submit(store: Store, session: str, request_id: str = "r1", text: str = "hi",
                 *, take: bool = True):
    """Submit as a client, then (``take``) take the request up as a Brain would."""
    task = Task(id=f"task-{request_id}", kind="generation", owner=session)
    result = await store.inbox.submit(
        session, agent="notices", compat=1, wake_subject=WAKE, request_id=request_id,
        text=text, task=task, worker=worker_ref("client", "c"), submission_id=f"sub-{request_id}",
    )
    if take:
        await take_up(store, session, BRAIN)
    return result


def intent(session: str, run_id: str, group: str | None = None) -> ToolIntent:
    return ToolIntent(
        run_id=run_id, session_id=session, task_id="task-r1", tool="send_email",
        arguments={"to": "a@example.com"}, replay="confirm", operation_id=f"op-{run_id}",
        wake_subject=WAKE, group=group,
    )


async def outbox_rows(store: Store, session: str) -> list[OutboxRow]:
    box = Outbox(store.redis, store.keys)
    shard = store.keys.shard_of(session)
    await box.ensure_groups([shard])
    return await box.read([shard], "reader", 100, None)


async def test_submit_is_idempotent_and_writes_everything_at_once(store: Store) -> None:
    sub, created = await submit(store, "s1")
    again, created_again = await submit(store, "s1")
    assert created and not created_again
    assert again == sub
    with pytest.raises(ConflictError, match=r"request id r1 in session s1 .* sub-r1"):
        await submit(store, "s1", text="different text")  # a reused id, another input
    state = await store.load("s1")
    assert state.meta.agent == "notices" and state.meta.wake_subject == WAKE
    assert [e.text for e in state.entries] == ["hi"]
    assert list(state.tasks) == ["task-r1"]
    assert await store.redis.hkeys(store.keys.session("s1").inbox) == []  # taken up once
    rows = await outbox_rows(store, "s1")  # the request's wake, on the session's subject
    assert [r.subject for r in rows] == [WAKE]
    assert rows[0].id == "s1/0/s.r1"


async def test_racing_submissions_with_one_request_id_make_one_submission(store: Store) -> None:
    results = await asyncio.gather(*(submit(store, "race", "same", take=False)
                                     for _ in range(20)))
    assert sum(created for _, created in results) == 1
    assert len({sub.id for sub, _ in results}) == 1
    await take_up(store, "race", BRAIN)
    state = await store.load("race")
    assert state.entry_count == 1 and len(state.submissions) == 1


async def test_a_waiter_reads_a_submission_only_once_a_brain_took_it_up(store: Store) -> None:
    sub, created = await submit(store, "w1", take=False)
    assert created and sub == await store.inbox.submission("w1", sub.id)  # the script's own echo
    for fresh in (True, False):  # the inbox looked at first, or the submissions
        assert await store.inbox.taken_up(sub, fresh=fresh) is None  # its request waits
    await take_up(store, "w1", BRAIN)
    committed = await store.inbox.submission("w1", sub.id)
    gone = sub.model_copy(update={"id": "sub-unknown", "request_id": "unknown"})
    for fresh in (True, False):
        assert await store.inbox.taken_up(sub, fresh=fresh) == committed
        with pytest.raises(NotFoundError):
            await store.inbox.taken_up(gone, fresh=fresh)


async def test_session_of_another_agent_is_refused(store: Store) -> None:
    await submit(store, "s2")
    task = Task(id="t2", kind="generation", owner="s2")
    with pytest.raises(ConflictError):
        await store.inbox.submit("s2", agent="other", compat=1, wake_subject=WAKE, request_id="r9",
                                 text="x", task=task, worker=BRAIN, submission_id="sub-9")


async def test_requests_for_a_new_session_at_other_compat_levels_are_refused(
    store: Store,
) -> None:
    """The request that opens a session sets its level: pending requests at two levels
    would open it at whichever the Brain read first (their ids' order), and carry the other
    out at a level it was not sent for."""
    task = Task(id="t-c3", kind="generation", owner="s-c3")
    await store.inbox.submit("s-c3", agent="notices", compat=3, wake_subject=WAKE, request_id="zz",
                             text="at three", task=task, worker=BRAIN, submission_id="sub-zz")
    with pytest.raises(ConflictError, match=r"requested at compat level 3 .* not at 1"):
        await store.inbox.submit("s-c3", agent="notices", compat=1, wake_subject=WAKE,
                                 request_id="aa", text="at one", task=task.model_copy(
                               update={"id": "t-c1"}), worker=BRAIN, submission_id="sub-aa")
    assert await store.redis.hkeys(store.keys.session("s-c3").inbox) == ["submit:zz"]
    # Once the session is open, its level is its own: a request at another level joins it.
    await submit(store, "s4")
    await store.inbox.submit("s4", agent="notices", compat=2, wake_subject=WAKE, request_id="r2",
                             text="later", task=Task(id="t4b", kind="generation", owner="s4"),
                             worker=BRAIN, submission_id="sub-r2")


async def test_commit_is_all_or_nothing_when_a_write_is_invalid(store: Store) -> None:
    await submit(store, "s3")
    lease = await store.acquire("s3", BRAIN, 5000)
    before = await store.load("s3")
    # The last write (applying a run that never completed) is invalid: nothing may land.
    writes = Writes(
        entries=[Entry(kind="model", text="partial answer")],
        tasks=[Task(id="task-new", kind="generation", owner="s3")],
        runs=[intent("s3", "r-ok")],
        outbox=[OutboxRow(subject="t.tool.send_email", data="{}")],
        applied=["r-missing"],
    )
    with pytest.raises(ValidationError, match="r-missing"):
        await store.commit("s3", lease.fence, writes, BRAIN)
    after = await store.load("s3")
    assert after.entry_count == before.entry_count
    assert after.tasks.keys() == before.tasks.keys()
    assert after.runs == {} and after.meta.seq == before.meta.seq
    assert [r.subject for r in await outbox_rows(store, "s3")] == [WAKE]  # only submit's


async def test_outbox_rows_exist_exactly_when_their_commit_does(store: Store) -> None:
    await submit(store, "s4")
    lease = await store.acquire("s4", BRAIN, 5000)
    writes = Writes(runs=[intent("s4", "r-1")],
                    outbox=[OutboxRow(subject="t.tool.send_email", data='{"x":1}')])
    seq, _ = await store.commit("s4", lease.fence, writes, BRAIN)
    rows = await outbox_rows(store, "s4")
    assert sorted(r.id for r in rows) == ["s4/0/s.r1", f"s4/{seq}/0"]  # the request's wake
    # A refused commit leaves no row behind.
    with pytest.raises(StaleFenceError):
        await store.commit("s4", lease.fence - 1, writes, BRAIN)
    assert await outbox_rows(store, "s4") == []


async def test_stale_fence_is_rejected_with_its_facts(store: Store) -> None:
    await submit(store, "s5")
    lease = await store.acquire("s5", BRAIN, 5000)
    with pytest.raises(StaleFenceError) as info:
        await store.commit("s5", lease.fence + 7, Writes(entries=[Entry(kind="model")]), BRAIN)
    err = info.value
    assert (err.session_id, err.presented, err.current) == ("s5", lease.fence + 7, lease.fence)
    kinds = [r.kind for r in await store.receipts("s5")]
    assert kinds[-1] == "refused"


async def test_lease_expiry_then_takeover_fences_out_the_old_holder(store: Store) -> None:
    await submit(store, "s6")
    old = await store.acquire("s6", BRAIN, 200)
    with pytest.raises(LeaseBusyError) as busy:
        await store.acquire("s6", BRAIN_B, 200)
    assert busy.value.holder == "brain-a"

    async def takeover():
        try:
            return await store.acquire("s6", BRAIN_B, 5000)
        except LeaseBusyError:
            return None

    new = await eventually(takeover, message="takeover after lease expiry")
    assert new.fence == old.fence + 1 and new.takeover and new.previous_holder == "brain-a"
    with pytest.raises(StaleFenceError):
        await store.commit("s6", old.fence, Writes(entries=[Entry(kind="model")]), BRAIN)
    with pytest.raises(StaleFenceError):
        await store.renew("s6", old.fence, 1000)
    with pytest.raises(StaleFenceError):
        await store.release("s6", old.fence, 1000)
    await store.commit("s6", new.fence, Writes(entries=[Entry(kind="model", text="ok")]), BRAIN_B)
    kinds = [r.kind for r in await store.receipts("s6")]
    assert "takeover" in kinds and kinds.count("refused") == 1


async def test_a_lease_left_by_a_dead_worker_of_the_same_name_is_a_takeover(store: Store) -> None:
    """A worker restarted under its name (a supervisor's restart, a fixed --name) takes the
    lease its dead predecessor never released at once, and it is recorded as a takeover."""
    await submit(store, "s6b")
    old = await store.acquire("s6b", BRAIN, 60_000)  # then the process dies holding it
    reborn = BRAIN.model_copy(update={"pid": BRAIN.pid + 1})
    new = await store.acquire("s6b", reborn, 5000)
    assert new.fence == old.fence + 1 and new.takeover and new.previous_holder == "brain-a"
    last = (await store.receipts("s6b"))[-1]
    assert last.kind == "takeover" and last.worker == reborn
    with pytest.raises(StaleFenceError):
        await store.commit("s6b", old.fence, Writes(entries=[Entry(kind="model")]), BRAIN)
    await store.release("s6b", new.fence, 1000)
    again = await store.acquire("s6b", reborn, 5000)  # released: a plain lease again
    assert not again.takeover and (await store.receipts("s6b"))[-1].kind == "lease"


async def test_release_keeps_the_lease_when_work_arrived_meanwhile(store: Store) -> None:
    await submit(store, "s7")
    lease = await store.acquire("s7", BRAIN, 5000)
    await submit(store, "s7", request_id="r2", text="more", take=False)  # arrives while held
    assert await store.release("s7", lease.fence, 5000) is True  # dirty: keep going
    assert await store.release("s7", lease.fence, 5000) is False  # now released
    again = await store.acquire("s7", BRAIN_B, 5000)
    assert again.fence == lease.fence + 1 and not again.takeover


async def test_hands_claim_and_complete_under_attempt_fences(store: Store) -> None:
    await submit(store, "s8")
    lease = await store.acquire("s8", BRAIN, 5000)
    runs = [intent("s8", "r-a", group="g"), intent("s8", "r-b", group="g")]
    await store.commit("s8", lease.fence, Writes(runs=runs, groups={"g": 2}), BRAIN)
    first = await store.runs.claim("s8", "r-a", HANDS)
    assert first.status == "claimed" and first.attempt == 1 and not first.recovering
    # A duplicate message while the attempt is alive does not take over.
    dup = await store.runs.claim("s8", "r-a", HANDS_B)
    assert dup.status == "busy" and dup.holder == "hands-a"

    async def takeover():
        c = await store.runs.claim("s8", "r-a", HANDS_B, delivery=2)
        return c if c.status != "busy" else None

    second = await eventually(takeover, message="attempt takeover after heartbeat ttl")
    assert second.attempt == 2 and second.recovering and second.previous_worker == "hands-a"
    ok = ToolResult(outcome="ok", output={"sent": True}, attempt=1)
    with pytest.raises(StaleAttemptError) as stale:
        await store.runs.complete("s8", runs[0], first.attempt, ok, HANDS)
    assert (stale.value.presented, stale.value.current) == (1, 2)
    with pytest.raises(StaleAttemptError):
        await store.runs.heartbeat("s8", "r-a", first.attempt)
    await store.runs.heartbeat("s8", "r-a", second.attempt)
    woke = await store.runs.complete("s8", runs[0], second.attempt, ok, HANDS_B)
    assert woke is False  # r-b of the same group is still out
    assert (await store.runs.claim("s8", "r-a", HANDS)).status == "done"
    b = await store.runs.claim("s8", "r-b", HANDS)
    assert await store.runs.complete("s8", runs[1], b.attempt, ok, HANDS) is True
    state = await store.load("s8")
    assert state.meta.dirty
    run = state.runs["r-a"]
    assert run.status == "completed" and run.accepted_ms and run.completed_ms
    assert run.result == ok and len(run.attempts) == 1
    # The Brain applies: the third mark, and the runs leave the live set.
    await store.commit("s8", lease.fence, Writes(applied=["r-a", "r-b"]), BRAIN)
    state = await store.load("s8")
    assert state.runs == {}
    applied = await store.runs.get("s8", "r-a")
    assert applied and applied.applied_ms and applied.result == ok
    assert (await store.runs.claim("s8", "r-a", HANDS)).status == "done"
    marks = [(m.run_id, m.mark) for r in await store.receipts("s8") for m in r.marks]
    assert ("r-a", "accepted") in marks and ("r-a", "completed") in marks
    assert ("r-a", "applied") in marks


async def test_unknown_run_and_session(store: Store) -> None:
    await submit(store, "s9")
    assert (await store.runs.claim("s9", "r-none", HANDS)).status == "gone"
    with pytest.raises(NotFoundError):
        await store.load("nope")
    with pytest.raises(NotFoundError):
        await store.acquire("nope", BRAIN, 1000)
    with pytest.raises(ValidationError):
        await store.load("bad id with spaces")


async def test_task_state_round_trips_and_terminal_tasks_leave_the_live_set(store: Store) -> None:
    await submit(store, "s10")
    lease = await store.acquire("s10", BRAIN, 5000)
    task = (await store.load("s10")).tasks["task-r1"]
    waiting = task.model_copy(update={"state": Waiting(on=("r-1",), policy="failFast")})
    await store.commit("s10", lease.fence, Writes(tasks=[waiting]), BRAIN)
    assert (await store.load("s10")).tasks["task-r1"].state == waiting.state
    from baton.models import Terminal

    done = task.model_copy(update={"state": Terminal(outcome="completed")})
    await store.commit("s10", lease.fence, Writes(tasks=[done]), BRAIN)
    assert (await store.load("s10")).tasks == {}
    assert (await store.finished_tasks("s10"))["task-r1"].state.name == "terminal"


async def test_due_timers_become_wakes_and_deadlines_rearm(store: Store) -> None:
    await submit(store, "s11")
    box = Outbox(store.redis, store.keys)
    shard = store.keys.shard_of("s11")
    await outbox_rows(store, "s11")  # drain the submit's wake
    lease = await store.acquire("s11", BRAIN, 5000)
    from baton.store.writes import timer_member

    member = timer_member("task", "s11", "task-r1", WAKE)
    await store.commit("s11", lease.fence, Writes(timers_add={member: 1}, deadline_ms=-1), BRAIN)
    relay = await box.lease("acquire", shard, "relay-1", 5000)
    assert await box.fire_timers(shard, 100, 1000, "relay-1", relay.fence + 1) == -1  # stale
    assert await box.fire_timers(shard, 100, 1000, "relay-1", relay.fence) == 1
    rows = await box.read([shard], "reader", 100, None)
    assert [r.subject for r in rows] == [WAKE] and '"timer:task"' in rows[0].data
    assert await box.fire_timers(shard, 100, 1000, "relay-1", relay.fence) == 0  # removed
    assert (await store.load("s11")).meta.dirty


async def test_a_deadline_that_keeps_firing_backs_off_until_a_commit_arms_it_again(
    store: Store,
) -> None:
    """A session whose agent no Brain serves: its deadline fired every interval, forever,
    each firing a row on the shard's wake stream (about 5,800 a day a session, until the
    stream's limit refused every agent's wakes). Each firing now waits twice as long, up to
    8 intervals, and a Brain's commit (progress) arms it at the interval again."""
    await submit(store, "s12b")
    box = Outbox(store.redis, store.keys)
    shard = store.keys.shard_of("s12b")
    lease = await store.acquire("s12b", BRAIN, 5000)
    await store.commit("s12b", lease.fence, Writes(deadline_ms=1), BRAIN)  # armed by a commit
    relay = await box.lease("acquire", shard, "relay-1", 5000)
    timers = store.keys.timers(shard)
    [member] = [m for m in await store.redis.zrange(timers, 0, -1) if "|s12b|" in m]
    assert float(await store.redis.zscore(timers, member) or 0).is_integer()  # k = 0
    await store.redis.zadd(timers, {member: 1})  # due now (1 ms ahead may be this same ms)
    interval = 10_000
    waits = []
    for _ in range(8):
        assert await box.fire_timers(shard, 100, interval, "relay-1", relay.fence) == 1
        secs, micros = await store.redis.time()
        now = int(secs) * 1000 + int(micros) // 1000
        score = float(await store.redis.zscore(timers, member) or 0)
        waits.append(round((int(score) - now) / interval))
        # due again now, keeping the firing count in the score's fraction
        await store.redis.zadd(timers, {member: now - 1 + (score - int(score))})
        await store.redis.delete(store.keys.session("s12b").nudge)  # a Brain took the wake
    assert waits == [1, 2, 4, 8, 8, 8, 8, 8], waits
    await store.commit("s12b", lease.fence, Writes(deadline_ms=interval), BRAIN)  # progress
    assert await box.fire_timers(shard, 100, interval, "relay-1", relay.fence) == 0
    score = float(await store.redis.zscore(timers, member) or 0)
    assert score == int(score)  # armed anew: the backoff starts over
    await store.redis.zadd(timers, {member: 1})
    assert await box.fire_timers(shard, 100, interval, "relay-1", relay.fence) == 1
    secs, micros = await store.redis.time()
    now = int(secs) * 1000 + int(micros) // 1000
    after = float(await store.redis.zscore(timers, member) or 0)
    assert round((int(after) - now) / interval) == 1


async def test_a_deadline_whose_wake_no_brain_took_sends_no_other_for_an_hour(
    store: Store,
) -> None:
    """A session no Brain serves: its deadline's wake waits in the stream, untaken. Each
    later firing sent another (one every 2 minutes, 5,040 within the stream's 7 days, so
    some 200 such sessions filled the wake stream and every agent's wakes were refused).
    A firing now sends nothing while its last wake is untaken (the nudge holds the firing
    time, a lease deletes it), and sends again once that wake is an hour old."""
    await submit(store, "s12c")
    box = Outbox(store.redis, store.keys)
    shard = store.keys.shard_of("s12c")
    lease = await store.acquire("s12c", BRAIN, 5000)
    await store.commit("s12c", lease.fence, Writes(deadline_ms=1), BRAIN)
    await outbox_rows(store, "s12c")  # drain the submit's wake
    relay = await box.lease("acquire", shard, "relay-1", 5000)
    timers, nudge = store.keys.timers(shard), store.keys.session("s12c").nudge
    [member] = [m for m in await store.redis.zrange(timers, 0, -1) if "|s12c|" in m]

    async def fire() -> int:
        score = float(await store.redis.zscore(timers, member) or 0)
        await store.redis.zadd(timers, {member: 1 + (score - int(score))})  # due now
        return await box.fire_timers(shard, 100, 10_000, "relay-1", relay.fence)

    assert await fire() == 1  # the first wake
    fired_at = int(await store.redis.get(nudge) or 0)
    assert fired_at > 1  # the firing time, on Redis' clock
    assert [await fire() for _ in range(5)] == [0] * 5  # untaken: no other wake
    assert await store.redis.zscore(timers, member)  # but the deadline stays armed
    assert len(await outbox_rows(store, "s12c")) == 1
    await store.redis.set(nudge, fired_at - 3_600_000)  # that wake is an hour old now
    assert await fire() == 1  # sent again, in case the first was lost
    # a request's (or a Hands') "1" is no firing time: the deadline's wake goes out
    await store.redis.set(nudge, 1)
    assert await fire() == 1
    # a Brain took the wake (its lease deleted the nudge): the next firing wakes again
    await store.acquire("s12c", BRAIN, 5000)
    assert await store.redis.get(nudge) is None
    assert await fire() == 1


async def test_two_decisions_in_one_millisecond_are_two_wakes(store: Store) -> None:
    """Cancels of two tasks recorded in the same millisecond (one MULTI here) each add a
    wake row; their ids were "<session>/<seq>/c.<ms>", the same for both, so JetStream
    deduplicated the second wake (approve.lua's "d.<ms>" likewise). Each id now names its
    target (approvals: the run), so each is its own message."""
    await submit(store, "s-2c", "r1")
    await submit(store, "s-2c", "r2")
    await outbox_rows(store, "s-2c")  # drain the requests' wakes
    sk = store.keys.session("s-2c")
    cancel = store.scripts.registered.cancel
    await cancel.load()
    wake = '{"v": 1, "session_id": "s-2c", "reason": "cancel"}'
    async with store.redis.pipeline(transaction=True) as p:
        for target in ("task-r1", "task-r2"):
            p.execute_command(*cancel.command(declared("cancel", sk), [
                "", "s-2c", target, wake, worker_ref("client", "c").model_dump_json(), "{}"]))
        replies = await p.execute()
    assert [r[0] for r in replies] == ["requested", "requested"]
    ids = [r.id for r in await outbox_rows(store, "s-2c")]
    assert len(ids) == 2 and len(set(ids)) == 2, ids
    assert [i.split("/c.")[1].split(".")[0] for i in ids] == ["task-r1", "task-r2"]


async def test_commits_past_256_commit_ids_do_not_read_every_record(store: Store) -> None:
    """The commit-id wrapper (_applied.lua) read every applied record (HGETALL) at each call
    once a session had 256, to drop those past the 10-minute TTL: a session with thousands
    of commits in ten minutes paid thousands of fields per commit. It now samples 16
    (HRANDFIELD) per call: old records still go, fresh ones (a retry may come for any)
    stay, and no call reads them all."""
    await submit(store, "s-ap")
    lease = await store.acquire("s-ap", BRAIN, 60_000)
    sk = store.keys.session("s-ap")
    secs, micros = await store.redis.time()
    now = int(secs) * 1000 + int(micros) // 1000
    old = {f"old-{i}": f"{now - 700_000} [1]" for i in range(1000)}  # past the 10 minutes
    fresh = {f"new-{i}": f"{now} [1]" for i in range(1000)}
    await store.redis.hset(sk.applied, mapping={**old, **fresh})
    def calls(stats: dict[str, Any], command: str) -> int:
        return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))

    before = await store.redis.info("commandstats")
    args = [lease.fence, BRAIN.model_dump_json(), "s-ap", *Writes(kind="note").to_script()]
    for i in range(40):
        await store.scripts.run("commit", sk, args, commit_id=f"c-{i}")
    after = await store.redis.info("commandstats")
    # before: one HGETALL per commit, of 2,000+ fields (nothing else here reads a hash whole)
    assert calls(after, "hgetall") == calls(before, "hgetall")
    assert calls(after, "hrandfield") - calls(before, "hrandfield") == 40
    records = await store.redis.hgetall(sk.applied)
    assert all(k in records for k in fresh) and all(f"c-{i}" in records for i in range(40))
    assert sum(k in records for k in old) < 1000  # the sampled old ones went


async def test_a_shard_stream_of_another_type_stalls_only_its_own_shard(store: Store) -> None:
    """One XREADGROUP reads every shard a relay holds: a shard's wakes stream replaced by a
    string (WRONGTYPE) failed it for all of them, retried forever."""
    await submit(store, "s13", take=False)
    box = Outbox(store.redis, store.keys)
    shard = store.keys.shard_of("s13")
    broken = (shard + 1) % store.keys.shards
    await box.ensure_groups([shard, broken])
    await store.redis.delete(store.keys.wakes(broken))
    await store.redis.set(store.keys.wakes(broken), "not a stream")
    rows = await box.read([broken, shard], "relay-a", 100, None)
    assert [r.session_id for r in rows] == ["s13"]  # the submit's wake, from the good shard


async def test_the_cluster_view_counts_requests_waiting_in_an_open_sessions_inbox(
    store: Store,
) -> None:
    """A message to an idle session, no Brain taking it up: the row said ``settled`` (work
    was counted from the live tasks only), so it was never listed as blocked."""
    from baton.cli.inspect import session_rows

    await submit(store, "s14")  # opened, taken up; no Brain ran it: its task is live
    settle = Writes(kind="final", tasks=[], deadline_ms=-1)
    lease = await store.acquire("s14", BRAIN, 5000)
    state = await store.load("s14")
    done = [t.model_copy(update={"state": Terminal(outcome="completed")})
            for t in state.tasks.values()]
    settle.tasks = done
    await store.commit("s14", lease.fence, settle, BRAIN)
    await store.release("s14", lease.fence, 5000)
    idle = await session_rows(store, ["s14"], set(), now_ms())
    assert idle[0]["state"] != "blocked" and idle[0]["blocked"] is None, idle  # no work
    before = idle[0]["submissions"].get("accepted", 0)
    await submit(store, "s14", request_id="r2", text="anyone?", take=False)
    unserved = await session_rows(store, ["s14"], set(), now_ms())
    assert unserved[0]["state"] == "blocked", unserved
    assert "no live Brain serves notices" in unserved[0]["blocked"]
    assert unserved[0]["submissions"]["accepted"] == before + 1  # the one waiting
    served = await session_rows(store, ["s14"], {("notices", 1)}, now_ms())
    assert served[0]["state"] == "pending", served


async def test_own_pending_rows_are_read_again_and_deleted_ones_acknowledged(
    store: Store,
) -> None:
    """What a relay restarted under its name finds: its unacknowledged rows, and none left
    pending forever once their row was deleted."""
    await submit(store, "s12")
    box = Outbox(store.redis, store.keys)
    shard = store.keys.shard_of("s12")
    await box.ensure_groups([shard])
    taken = await box.read([shard], "relay-a", 100, None)
    assert len(taken) == 1
    assert await box.read_pending([shard], "relay-a", 100) == (taken, True)
    assert await box.read_pending([shard], "relay-b", 100) == ([], False)  # only its own
    await store.redis.xdel(store.keys.wakes(shard), taken[0].stream_id.rpartition(":")[2])
    assert await box.read_pending([shard], "relay-a", 100) == ([], True)  # acknowledged
    assert await box.read_pending([shard], "relay-a", 100) == ([], False)


async def test_down_redis_gives_a_clear_error_fast() -> None:
    settings = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", namespace="down")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(RedisUnavailable, match="cannot reach Redis"):
        await Store.connect(settings)
    assert loop.time() - started < 2.0


async def test_a_client_waiting_on_a_redis_that_went_away_gets_redis_unavailable(
    tmp_path: Path,
) -> None:
    """A read waits Redis out for client_connect_wait_s, then raises one error of the tree
    (it was redis-py's own ConnectionError, outside BatonError); a wait, to its own deadline,
    then says Redis was unreachable."""
    async with RedisServer(tmp_path / "r") as server:
        settings = Settings(redis_url=server.url, namespace="gone",
                            client_connect_wait_s=0.3)
        client = await Client.connect(settings)
        try:
            sub, _ = await client.submit("anyone there?", agent="notices")
            server.kill()
            with pytest.raises(WaitTimeout, match="Redis unreachable"):
                await client.wait(sub, timeout=1.0)
            with pytest.raises(RedisUnavailable):
                await client.task(sub.session_id, sub.task_id)
        finally:
            await client.close()


async def test_oversized_input_is_refused_and_nothing_lands(store: Store) -> None:
    with pytest.raises(ValidationError, match="limit"):
        await submit(store, "s12", text="x" * (store.settings.max_payload_bytes + 1))
    # The limit is in bytes as stored: a quarter as many four-byte characters are over it.
    rockets = "\N{ROCKET}" * (store.settings.max_payload_bytes // 4 + 1)
    assert len(rockets) < store.settings.max_payload_bytes < len(rockets.encode())
    with pytest.raises(ValidationError, match="bytes, over the"):
        await submit(store, "s12", text=rockets)
    with pytest.raises(NotFoundError):
        await store.load("s12")


def test_session_ids_share_one_hash_tag_with_their_shard_keys(settings: Settings) -> None:
    from baton.store.keys import Keys

    keys = Keys("ns", 16)
    for sid in (str(uuid.uuid4()) for _ in range(50)):
        sk = keys.session(sid)
        tags = {k[k.index("{"): k.index("}") + 1] for k in sk.all()}
        assert len(tags) == 1
