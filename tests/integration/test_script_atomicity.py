"""Every session script validates before its first write (DESIGN 4.2; _lib.lua's rule).

Redis does not roll back a script that fails midway. Hypothesis picks a script, one of the
session's keys and a corruption (deleted, replaced by a value of the wrong type, a field or
element overwritten with garbage); the script then runs with otherwise valid arguments on a
session that has a submission, a lease, a dispatched tool run in a group and a claimed
attempt. It must either apply or write nothing: when it fails, a DUMP of every key of the
session and its shard is what it was before (a 'refused' receipt, which a fence or attempt
refusal appends on purpose, is the one allowed write).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baton.errors import BatonError, CorruptStateError, ValidationError
from baton.models import Entry, Task, ToolIntent, ToolResult
from baton.store.keys import SessionKeys
from baton.store.store import Store, worker_ref
from baton.store.writes import Writes
from tests.helpers import take_up

BRAIN = worker_ref("brain", "brain-a")
HANDS = worker_ref("hands", "hands-a")
CLIENT = worker_ref("client", "c")
WAKE = "a.wake.notices.1"
KEYS = ("meta", "entries", "tasks", "done", "docs", "subs", "reqs", "runs", "runs_done",
        "receipts", "outbox", "timers", "applied", "sessions", "intents", "inbox")
CORRUPTIONS = ("delete", "wrong_type", "garbage")


class Session:
    """A session with a submission, a lease (fence), a run in group 'g', claimed (attempt)."""

    def __init__(self, store: Store, sid: str, fence: int, intent: ToolIntent, attempt: int):
        self.store, self.sid, self.fence, self.intent, self.attempt = \
            store, sid, fence, intent, attempt

    @classmethod
    async def start(cls, store: Store) -> Session:
        sid = "a-" + uuid.uuid4().hex[:12]
        await store.inbox.submit(sid, agent="notices", compat=1, wake_subject=WAKE, request_id="r",
                                 text="hi",
                                 task=Task(id=f"{sid}-root", kind="generation", owner=sid),
                                 worker=CLIENT, submission_id=f"{sid}-sub")
        await take_up(store, sid, BRAIN)
        lease = await store.acquire(sid, BRAIN, 60_000)
        intent = ToolIntent(run_id=f"{sid}-r1", session_id=sid, task_id=f"{sid}-root",
                            tool="send_email", operation_id=f"{sid}-op1", wake_subject=WAKE,
                            group="g")
        await store.commit(sid, lease.fence, Writes(runs=[intent], groups={"g": 1}), BRAIN)
        claim = await store.runs.claim(sid, intent.run_id, HANDS)
        return cls(store, sid, lease.fence, intent, claim.attempt)


Op = Callable[[Session], Awaitable[Any]]


async def _acquire_and_load(s: Session) -> None:
    """The acquire that reads the state in its script: a record that does not parse is found
    once the script has applied (as with a load after it), so that is not a refusal."""
    try:
        await s.store.acquire_and_load(s.sid, BRAIN, 60_000)
    except (ValidationError, ValueError):  # ValueError: pydantic's, from a run record
        pass
RESULT = ToolResult(outcome="ok", output="sent", attempt=1)
OPS: dict[str, Op] = {
    "submit": lambda s: s.store.inbox.submit(
        s.sid, agent="notices", compat=1, wake_subject=WAKE, request_id="r2", text="again",
        task=Task(id=f"{s.sid}-t2", kind="generation", owner=s.sid), worker=CLIENT,
        submission_id=f"{s.sid}-sub2"),
    "start": lambda s: s.store.inbox.start_task(
        s.sid, agent="notices", compat=1, wake_subject=WAKE, request_id="r3",
        task=Task(id=f"{s.sid}-t3", kind="generation", owner=s.sid), worker=CLIENT),
    "acquire": lambda s: s.store.acquire(s.sid, BRAIN, 60_000),
    "acquire_and_load": lambda s: _acquire_and_load(s),
    "renew": lambda s: s.store.renew(s.sid, s.fence, 60_000, BRAIN),
    "release": lambda s: s.store.release(s.sid, s.fence, 60_000),
    "hand_over": lambda s: s.store.hand_over(s.sid, s.fence),
    "commit": lambda s: s.store.commit(s.sid, s.fence, Writes(
        entries=[Entry(kind="model", text="ok", task_id=f"{s.sid}-root")],
        deadline_ms=5_000, cancel_runs=[s.intent.run_id],
        cancel_result=RESULT.to_json()), BRAIN),
    "claim": lambda s: s.store.runs.claim(s.sid, s.intent.run_id, HANDS),
    "heartbeat": lambda s: s.store.runs.heartbeat(s.sid, s.intent.run_id, s.attempt, HANDS),
    "complete": lambda s: s.store.runs.complete(s.sid, s.intent, s.attempt, RESULT, HANDS),
    "slot_wait": lambda s: s.store.runs.slot_wait(s.sid, s.intent.run_id, "send_email", HANDS,
                                                  "waiting", position=2),
    "partial": lambda s: s.store.save_partial(s.sid, s.fence, BRAIN, task_id=f"{s.sid}-root",
                                              request_id="q", offset=0, delta="hel",
                                              chars=3),
    "cancel": lambda s: s.store.decisions.cancel(s.sid, None, CLIENT, "stop"),
}


async def _corrupt(store: Store, key: str, kind: str, garbage: str, pick: int) -> None:
    r = store.redis
    if kind == "delete":
        await r.delete(key)
        return
    kind_of = await r.type(key)
    if kind == "wrong_type" or kind_of == "none":
        await r.delete(key)
        if kind_of == "string":
            await r.rpush(key, garbage)
        else:
            await r.set(key, garbage)
        return
    if kind_of == "hash":
        fields = sorted(await r.hkeys(key))
        await r.hset(key, fields[pick % len(fields)], garbage)
    elif kind_of == "list":
        await r.lset(key, pick % await r.llen(key), garbage)
    elif kind_of == "zset":
        await r.zadd(key, {garbage: 0})
    elif kind_of == "stream":
        await r.xadd(key, {"garbage": garbage})


async def _snapshot(store: Store, keys: list[str]) -> dict[str, Any]:
    """Each key's type and content. Not DUMP: a large hash's DUMP follows its hash table's
    bucket order, which Redis's incremental rehashing changes on mere reads."""
    return {k: await _content(store, k) for k in keys}


async def _content(store: Store, key: str) -> Any:
    r = store.redis
    kind = await r.type(key)
    if kind == "hash":
        return kind, await r.hgetall(key)
    if kind == "list":
        return kind, await r.lrange(key, 0, -1)
    if kind == "zset":
        return kind, await r.zrange(key, 0, -1, withscores=True)
    if kind == "stream":
        return kind, await r.xrange(key)
    if kind == "set":
        return kind, sorted(await r.smembers(key))
    return kind, await r.get(key) if kind == "string" else None


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from(sorted(OPS)), key=st.sampled_from(KEYS),
       kind=st.sampled_from(CORRUPTIONS), pick=st.integers(0, 20),
       garbage=st.sampled_from(["", "x", "{not json", "-1.5", "[1,", "nan"]))
async def test_a_script_applies_fully_or_writes_nothing(
    store: Store, op: str, key: str, kind: str, pick: int, garbage: str
) -> None:
    s = await Session.start(store)
    sk = store.keys.session(s.sid)
    names = dict(zip(KEYS, [*sk.all(), sk.intents, sk.inbox], strict=True))
    shard = {k: await store.redis.dump(names[k]) for k in ("outbox", "timers", "sessions")}
    try:
        await _corrupt(store, names[key], kind, garbage, pick)
        await _check(store, s, names, op, key, kind, garbage)
    finally:  # the shard's keys are shared by the next examples' sessions
        for k, dumped in shard.items():
            await store.redis.delete(names[k])
            if dumped is not None:
                await store.redis.restore(names[k], 0, dumped)


async def _check(store: Store, s: Session, names: dict[str, str], op: str, key: str,
                 kind: str, garbage: str) -> None:
    before = await _snapshot(store, list(names.values()))
    receipts_before = await store.redis.xlen(names["receipts"]) \
        if await store.redis.type(names["receipts"]) == "stream" else None
    try:
        await OPS[op](s)
    except BatonError as exc:
        after = await _snapshot(store, list(names.values()))
        changed = {k for k, v in before.items() if after[k] != v}
        if changed == {names["receipts"]} and exc.code in ("stale_fence", "stale_attempt"):
            assert receipts_before is not None
            assert await store.redis.xlen(names["receipts"]) == receipts_before + 1
            last = await store.redis.xrevrange(names["receipts"], count=1)
            assert last[0][1]["kind"] == "refused"
            return
        assert not changed, (op, key, kind, garbage, exc, changed)


@pytest.mark.parametrize("op", ["claim", "heartbeat", "complete"])
async def test_a_number_lua_reads_but_cannot_write_back_is_refused_before_any_write(
    store: Store, op: str
) -> None:
    """"nan" and "inf" pass Lua's tonumber (strtod) and only fail when a receipt is encoded,
    after the writes: every field of the run record, each such value, refused or applied whole."""
    probe = await Session.start(store)
    fields = sorted(await store.redis.hkeys(store.keys.session(probe.sid).runs))
    for pick in range(len(fields)):
        for garbage in ("nan", "inf", "-inf", "1e999"):
            s = await Session.start(store)
            sk = store.keys.session(s.sid)
            names = dict(zip(KEYS, [*sk.all(), sk.intents, sk.inbox], strict=True))
            await _corrupt(store, names["runs"], "garbage", garbage, pick)
            await _check(store, s, names, op, "runs", "garbage", garbage)


@pytest.mark.parametrize("op", ["acquire", "commit", "claim", "complete", "submit", "partial",
                                "slot_wait"])
async def test_a_receipts_key_of_another_type_is_refused_as_corrupt_with_nothing_written(
    store: Store, op: str
) -> None:
    """These scripts write their receipt first (receipt_first) instead of checking the
    receipts key's type before every call: their role's receipts stream of another type
    still fails the call as CORRUPT, naming the key, with nothing written."""
    s = await Session.start(store)
    sk = store.keys.session(s.sid)
    names = dict(zip(KEYS, [*sk.all(), sk.intents, sk.inbox], strict=True))
    own = _own_receipts(sk, op)
    names["own receipts"] = own
    await store.redis.delete(own)
    await store.redis.set(own, "x")
    before = await _snapshot(store, list(names.values()))
    with pytest.raises(CorruptStateError, match=f"{own.rsplit(':', 1)[1]} key is a string"):
        await OPS[op](s)
    assert await _snapshot(store, list(names.values())) == before


def _own_receipts(sk: SessionKeys, op: str) -> str:
    """The receipts stream of the role running ``op``."""
    return (sk.receipts_hands if op in ("claim", "complete", "heartbeat", "slot_wait")
            else sk.receipts_client if op == "submit" else sk.receipts)


@pytest.mark.parametrize("op", ["claim", "complete", "submit"])
async def test_another_roles_receipts_of_another_type_do_not_stop_a_script(
    store: Store, op: str
) -> None:
    """A script reads the other roles' receipts streams only to order its receipt after
    theirs (receipt_id, with pcall): one of another type does not stop it."""
    s = await Session.start(store)
    sk = store.keys.session(s.sid)
    await store.redis.delete(sk.receipts)
    await store.redis.set(sk.receipts, "x")
    before = await store.redis.xlen(_own_receipts(sk, op))
    await OPS[op](s)
    assert await store.redis.xlen(_own_receipts(sk, op)) == before + 1


STALE: dict[str, Op] = {
    "renew": lambda s: s.store.renew(s.sid, s.fence - 1, 60_000, BRAIN),
    "heartbeat": lambda s: s.store.runs.heartbeat(s.sid, s.intent.run_id, s.attempt + 1, HANDS),
}


@pytest.mark.parametrize("op", sorted(STALE))
async def test_a_refusal_receipt_on_a_receipts_key_of_another_type_is_refused_as_corrupt(
    store: Store, op: str
) -> None:
    """renew and heartbeat write a receipt only when they refuse a stale caller, and check
    the receipts key's type only then: still CORRUPT, naming the key, with nothing written."""
    s = await Session.start(store)
    sk = store.keys.session(s.sid)
    names = dict(zip(KEYS, [*sk.all(), sk.intents, sk.inbox], strict=True))
    own = names["own receipts"] = _own_receipts(sk, op)
    await store.redis.delete(own)
    await store.redis.set(own, "x")
    before = await _snapshot(store, list(names.values()))
    with pytest.raises(CorruptStateError, match=f"{own.rsplit(':', 1)[1]} key is a string"):
        await STALE[op](s)
    assert await _snapshot(store, list(names.values())) == before


async def test_a_completion_checks_the_wakes_stream_only_when_it_writes_a_wake(
    store: Store
) -> None:
    """complete.lua checks the wakes stream's type only for the completion that wakes the
    Brain (the last of its group): an earlier result of the group completes whatever the
    key holds; the last is refused as CORRUPT with nothing written."""
    sid = "a-" + uuid.uuid4().hex[:12]
    await store.inbox.submit(sid, agent="notices", compat=1, wake_subject=WAKE, request_id="r",
                             text="hi", task=Task(id=f"{sid}-root", kind="generation", owner=sid),
                             worker=CLIENT, submission_id=f"{sid}-sub")
    await take_up(store, sid, BRAIN)
    lease = await store.acquire(sid, BRAIN, 60_000)
    intents = [ToolIntent(run_id=f"{sid}-r{i}", session_id=sid, task_id=f"{sid}-root",
                          tool="send_email", operation_id=f"{sid}-op{i}", wake_subject=WAKE,
                          group="g") for i in (1, 2)]
    await store.commit(sid, lease.fence, Writes(runs=intents, groups={"g": 2}), BRAIN)
    attempts = [(await store.runs.claim(sid, i.run_id, HANDS)).attempt for i in intents]
    sk = store.keys.session(sid)
    wakes = store.keys.wakes(sk.shard)
    saved = await store.redis.dump(wakes)
    await store.redis.delete(wakes)
    await store.redis.set(wakes, "x")
    try:
        assert await store.runs.complete(sid, intents[0], attempts[0], RESULT, HANDS) is False
        names = [*sk.all(), sk.intents, sk.inbox, wakes]
        before = await _snapshot(store, names)
        with pytest.raises(CorruptStateError, match="wakes key is a string"):
            await store.runs.complete(sid, intents[1], attempts[1], RESULT, HANDS)
        assert await _snapshot(store, names) == before
    finally:  # the shard's wakes stream is shared by the other tests' sessions
        await store.redis.delete(wakes)
        if saved is not None:
            await store.redis.restore(wakes, 0, saved)
