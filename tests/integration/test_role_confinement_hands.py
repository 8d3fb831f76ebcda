"""What the Hands' Redis credential cannot do (and each role's liveness records and dead
letters), tried as an attacker would, one act per test (see test_role_confinement.py)."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from redis.exceptions import ResponseError

from baton.auth import redis_acl
from baton.bus.subjects import BusNames
from baton.errors import ConflictError
from baton.models import ToolResult
from baton.store.state import parse_runs, with_intents
from baton.store.store import Store, worker_ref
from tests.integration.confinement import (
    OWN,
    PASSWORDS,
    WAKE_ROW,
    Confined,
    as_role,
    hold_as_brain,
    log_key,
    row,
    sk,
)

# --- Hands ---------------------------------------------------------------------------------

async def test_hands_cannot_set_a_session_fence_back(confined: Confined) -> None:
    await as_role(confined, "hands", lambda r: r.hset(sk(confined).meta, "fence", 1))


async def test_hands_cannot_take_or_extend_a_lease(confined: Confined) -> None:
    await as_role(confined, "hands", lambda r: r.hset(
        sk(confined).meta, mapping={"holder": "hands-1", "lease_until": 2**40}))


async def test_hands_cannot_append_an_entry(confined: Confined) -> None:
    await as_role(confined, "hands", lambda r: r.rpush(sk(confined).entries, '{"forged":1}'))


async def test_hands_cannot_rewrite_an_entry(confined: Confined) -> None:
    await as_role(confined, "hands", lambda r: r.lset(sk(confined).entries, 0, '{"forged":1}'))


async def test_hands_cannot_write_tasks_documents_or_submissions(confined: Confined) -> None:
    await as_role(confined, "hands", lambda r: r.hset(sk(confined).tasks, "t1", "{}"))


async def test_hands_cannot_change_an_applied_run(confined: Confined) -> None:
    await as_role(confined, "hands", lambda r: r.hset(
        sk(confined).runs_done, "r0.result", '{"outcome":"error"}'))


async def test_hands_cannot_rewrite_a_committed_intent(confined: Confined) -> None:
    await as_role(confined, "hands", lambda r: r.hset(sk(confined).intents, "r1",
                                                      '{"tool": "send_email"}'))


async def test_a_run_forged_by_hands_in_the_run_records_never_reaches_the_brain(
    confined: Confined,
) -> None:
    """The Hands may write the runs hash, but a run exists for the Brain only by its
    committed intent: a forged record there (intent, result) is not part of the state."""
    forged = {"run_id": "r-forged", "session_id": OWN, "task_id": "t1", "tool": "echo",
              "operation_id": "op9", "wake_subject": f"{confined.namespace}.wake.notices.1"}
    hands = confined.connect("hands")
    await hands.hset(sk(confined).runs, mapping={
        "r-forged.intent": json.dumps(forged), "r-forged.status": "completed",
        "r-forged.result": '{"outcome":"ok","output":"forged"}'})
    await hands.aclose()
    store = await Store.connect(confined.settings("admin"))
    try:
        keys = sk(confined)
        runs = parse_runs(with_intents(await store.redis.hgetall(keys.runs),
                                       await store.redis.hgetall(keys.intents)))
        assert "r-forged" not in runs and "r1" in runs  # what Store.load builds its state of
        assert await store.runs.get(OWN, "r-forged") is None
    finally:
        await store.close()


async def test_hands_cannot_clear_a_cancel_mark(confined: Confined) -> None:
    await as_role(confined, "hands", lambda r: r.hdel(sk(confined).intents, "r1.cancel"))


async def test_hands_cannot_change_what_an_approval_must_present(confined: Confined) -> None:
    await as_role(confined, "hands", lambda r: r.hset(sk(confined).intents, "r2.digest",
                                                      "d-forged"))


async def test_a_digest_or_cancel_forged_by_hands_in_the_run_records_changes_nothing(
    confined: Confined,
) -> None:
    """What the Hands may write (the runs hash) is not where an approval's digest or a
    cancel mark is read: a forged digest does not approve, a deleted mark still cancels."""
    hands = confined.connect("hands")
    await hands.hset(sk(confined).runs, mapping={"r2.digest": "d-forged", "r1.cancel": ""})
    await hands.hdel(sk(confined).runs, "r1.cancel")
    await hands.aclose()
    client = await Store.connect(confined.settings("client"))
    try:
        with pytest.raises(ConflictError, match="d-real"):
            await client.decisions.approve(BusNames(confined.namespace), OWN, "r2", "d-forged",
                                           worker_ref("client", "c"))
    finally:
        await client.close()
    store = await Store.connect(confined.settings("admin"))
    try:
        run = await store.runs.get(OWN, "r1")
        assert run is not None and run.cancel_ms == 7
        gated = await store.runs.get(OWN, "r2")
        assert gated is not None and gated.status == "awaiting_approval"
    finally:
        await store.close()


async def test_hands_cannot_add_a_wake_row_to_the_outbox(confined: Confined) -> None:
    await as_role(confined, "hands", lambda r: r.xadd(sk(confined).outbox,
                                                      row(confined, WAKE_ROW)))


async def test_hands_cannot_wake_through_a_script_of_its_own(confined: Confined) -> None:
    lua = "return redis.call('XADD', KEYS[1], '*', unpack(ARGV))"
    fields = [f.format(ns=confined.namespace) for f in WAKE_ROW]
    await as_role(confined, "hands", lambda r: r.eval(lua, 1, sk(confined).outbox, *fields))


async def test_hands_cannot_flush_trim_or_delete(confined: Confined) -> None:
    await as_role(confined, "hands", lambda r: r.delete(sk(confined).meta))
    await as_role(confined, "hands", lambda r: r.xtrim(sk(confined).outbox, maxlen=0))
    await as_role(confined, "hands", lambda r: r.flushall())


async def test_no_role_but_the_brain_may_replace_or_expire_what_it_writes(
    confined: Confined,
) -> None:
    """SET replaces a key of any type (a shard's wakes stream made a string stalls every
    shard its relay reads) and PEXPIRE deletes any key in time (a session's receipts): each
    is granted on the one key a role's scripts need it for (the nudge, the applied ids)."""
    s = sk(confined)
    lua = "return redis.call(ARGV[1], KEYS[1], ARGV[2])"
    for role, keys in (("hands", (s.receipts, s.wakes, s.runs)),
                       ("client", (s.receipts, s.wakes, s.inbox)),
                       ("relay", (s.outbox, s.wakes))):
        for key in keys:
            await as_role(confined, role, lambda r, key=key: r.set(key, "x"))
            await as_role(confined, role, lambda r, key=key: r.pexpire(key, 1))
        # nor inside a script, where each call is checked on its own
        await as_role(confined, role, lambda r, key=keys[0]: r.eval(lua, 1, key, "SET", "x"))


async def test_no_role_may_replace_the_store_epoch(confined: Confined) -> None:
    """Each role may write the epoch once, on a new store (SETNX); replacing it (SET, with
    NX or not: ACLs cannot tell) stopped every worker of the namespace, 'store lost'."""
    key = f"{confined.namespace}:{confined.keys.tag(0)}:epoch"
    for role in ("hands", "client", "relay", "brain"):
        await as_role(confined, role, lambda r: r.set(key, '{"v":1,"id":"evil"}'))
        await as_role(confined, role, lambda r: r.set(key, "x", nx=True))


async def test_hands_cannot_announce_a_brain(confined: Confined) -> None:
    """A forged Brain liveness record would make inspect and clients see a Brain serving an
    agent that none serves."""
    record = json.dumps({"role": "brain", "name": "b9", "seen_ms": 2**41,
                         "serves": [["notices", 1]]})
    await as_role(confined, "hands", lambda r: r.hset(log_key(confined, "workers", "brain"),
                                                      "brain:b9", record))


async def test_hands_cannot_remove_a_relays_liveness_record(confined: Confined) -> None:
    await as_role(confined, "hands", lambda r: r.hdel(log_key(confined, "workers", "relay"),
                                                      "relay:r1"))


async def test_hands_cannot_append_or_trim_brain_dead_letters(confined: Confined) -> None:
    key = log_key(confined, "dead", "brain")
    await as_role(confined, "hands", lambda r: r.xadd(key, {"source": "wake", "reason": "x"}))
    await as_role(confined, "hands", lambda r: r.xadd(key, {"f": "v"}, maxlen=0))


async def test_relay_cannot_announce_a_hands_or_write_its_dead_letters(
    confined: Confined,
) -> None:
    await as_role(confined, "relay", lambda r: r.hset(log_key(confined, "workers", "hands"),
                                                      "hands:h9", "{}"))
    await as_role(confined, "relay", lambda r: r.xadd(log_key(confined, "dead", "hands"),
                                                      {"f": "v"}))


async def test_client_writes_no_liveness_record_and_sees_no_dead_letter(confined: Confined) -> None:
    for role in ("relay", "brain", "hands", "client"):
        await as_role(confined, "client", lambda r, role=role: r.hset(
            log_key(confined, "workers", role), f"{role}:x", "{}"))
        await as_role(confined, "client", lambda r, role=role: r.xadd(
            log_key(confined, "dead", role), {"f": "v"}))
        await as_role(confined, "client", lambda r, role=role: r.xrange(
            log_key(confined, "dead", role)))


async def test_each_role_announces_and_dead_letters_in_its_own_keys(
    confined: Confined,
) -> None:
    """What each role may do with the per-role logs, through the store's own functions."""
    from baton.store.deadletter import dead_letters, record_dead_letter
    from baton.store.workers import all_services
    for role in ("relay", "brain", "hands"):
        store = await Store.connect(confined.settings(role))
        try:
            field = f"{role}:{role}-1"
            await store.redis.hset(confined.keys.workers(field), field,
                                   json.dumps({"role": role, "name": f"{role}-1",
                                               "seen_ms": 1}))
            await record_dead_letter(store.redis, confined.keys, role=role, source=role,
                                     reason=f"by {role}", payload="p", session_id=OWN)
        finally:
            await store.close()
    admin = confined.connect("admin")
    try:
        seen = await all_services(admin, confined.keys, 2)
        assert {s["role"] for s in seen} >= {"relay", "brain", "hands"}
        reasons = {d["reason"] for d in await dead_letters(admin, confined.keys)}
        assert reasons >= {"by relay", "by brain", "by hands"}
    finally:
        await admin.aclose()


# --- held leases (baton.brain.held) ---------------------------------------------------------


async def _complete_a_run(c: Confined) -> tuple[str, bool]:
    """Seed a dispatched run of OWN (the fixture is shared by the module), then claim and
    complete it as a Hands; (its id, whether the completion woke the Brain)."""
    rid = "rh-" + uuid.uuid4().hex[:8]
    intent = {"run_id": rid, "session_id": OWN, "task_id": "t1", "tool": "echo",
              "operation_id": f"op-{rid}", "wake_subject": f"{c.namespace}.wake.notices.1"}
    admin = c.connect("admin")
    try:
        await admin.hset(sk(c).intents, mapping={rid: json.dumps(intent),
                                                 f"{rid}.status": "dispatched"})
    finally:
        await admin.aclose()
    settings = c.settings("hands")
    hands = await Store.connect(settings)
    try:
        me = worker_ref("hands", settings.worker_name)
        claim = await hands.runs.claim(OWN, rid, me)
        assert claim.status == "claimed" and claim.intent is not None, claim
        woke = await hands.runs.complete(OWN, claim.intent, claim.attempt,
                                         ToolResult(outcome="ok", output="done"), me)
    finally:
        await hands.close()
    return rid, woke


async def _wake_rows(c: Confined, rid: str) -> list[dict[str, str]]:
    admin = c.connect("admin")
    try:
        return [f for _, f in await admin.xrange(sk(c).wakes) if f"/w.{rid}." in f["id"]]
    finally:
        await admin.aclose()


async def test_a_confined_hands_tells_the_confined_brain_that_holds_the_session(
    confined: Confined,
) -> None:
    store, held, listener = await hold_as_brain(confined)
    try:
        waiting = asyncio.create_task(held.hold(OWN))
        rid, woke = await _complete_a_run(confined)
        assert woke
        heard = await asyncio.wait_for(waiting, 10)  # long before the hold's end
        assert heard is not None, "the hold ran its length: no signal came"
        assert not await _wake_rows(confined, rid)  # and no wake row for the relay
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        await store.close()


async def test_a_hands_without_the_held_channels_wakes_through_the_relay(
    confined: Confined,
) -> None:
    """A Hands whose ACL predates hold channels (no SPUBLISH there) still completes: its
    result is written as a wake row for the relay, and the holder's release finds it."""
    admin = confined.connect("admin")
    rules = redis_acl("hands", confined.namespace, PASSWORDS["hands"])
    try:
        older = [r for r in rules if ":held:" not in r and r != "+spublish"]
        assert len(older) == len(rules) - 2
        await admin.execute_command("ACL", "SETUSER", "hands", "reset", *older)
        await admin.hset(sk(confined).meta, mapping={"listen": "brain-1", "lease_until": 2**42})
        rid, woke = await _complete_a_run(confined)
        assert woke and len(await _wake_rows(confined, rid)) == 1
    finally:
        await admin.execute_command("ACL", "SETUSER", "hands", "reset", *rules)
        await admin.aclose()


@pytest.mark.parametrize("role", ["client", "relay", "hands"])
async def test_only_brains_hear_held_channels(confined: Confined, role: str) -> None:
    r = confined.connect(role)
    try:
        with pytest.raises(ResponseError, match=r"no permissions|NOPERM"):
            await r.execute_command("SSUBSCRIBE", confined.keys.hold_channel(
                confined.keys.shard_of(OWN), "brain-1"))
    finally:
        await r.aclose()
