"""What each role's Redis credential cannot do, tried as an attacker would, one act per test.

A private Redis gets the users of the ACL file that ``python -m baton.auth`` writes for
deploy/ (:func:`baton.auth.redis_acl_file`, rendered the way deploy/redis/start.sh does:
comments dropped, ``${ROLE_REDIS_PASSWORD}`` filled in), here with the client granted the
sessions ``acme-*`` only. Each test logs in as one role and tries one forbidden act with
plain Redis commands (or a script of its own), and checks that Redis refuses it and that the
session's keys are unchanged.

"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, ResponseError

from baton.auth import ROLES, redis_acl_file
from baton.bus.subjects import BusNames
from baton.devkit.servers import RedisServer
from baton.errors import BatonError, ConflictError, CredentialsError
from baton.models import Task
from baton.settings import Settings
from baton.store.keys import Keys, SessionKeys
from baton.store.state import parse_runs, with_intents
from baton.store.store import Store, worker_ref

PASSWORDS = {role: f"{role}-pw-{uuid.uuid4().hex[:8]}" for role in (*ROLES, "admin")}
GRANT = "acme-*"
OWN, OTHER = "acme-1", "other-1"  # the client's session and one outside its grant

HOLE_CLIENT = ("submit, start and approve write meta and the outbox of the "
               "client's own sessions")


def gap(reason: str) -> pytest.MarkDecorator:
    """An act Redis does not refuse yet: the test fails only by the act succeeding."""
    return pytest.mark.xfail(strict=True, raises=pytest.fail.Exception, reason=reason)


def render_acl(text: str) -> list[tuple[str, list[str]]]:
    """The users of an ACL file as deploy/redis/start.sh renders it: (name, rules)."""
    users = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        for role, password in PASSWORDS.items():
            line = line.replace(f"${{{role.upper()}_REDIS_PASSWORD}}", password)
        _, name, *rules = line.split()
        users.append((name, rules))
    return users


@dataclass
class Confined:
    server: RedisServer
    namespace: str
    keys: Keys

    def url(self, role: str, password: str | None = None) -> str:
        secret = PASSWORDS[role] if password is None else password
        return self.server.url.replace("redis://", f"redis://{role}:{secret}@")

    def settings(self, role: str) -> Settings:
        return Settings(redis_url=self.url(role), namespace=self.namespace,
                        worker_name=f"{role}-1")

    def connect(self, role: str) -> aioredis.Redis:
        return aioredis.Redis.from_url(self.url(role), decode_responses=True)


@pytest.fixture(scope="module")
async def confined() -> AsyncIterator[Confined]:
    namespace = "acl" + uuid.uuid4().hex[:6]
    async with RedisServer() as server:
        setup = aioredis.Redis.from_url(server.url)
        users = render_acl(redis_acl_file(namespace, client_sessions=GRANT))
        # The default user goes last: this connection is the default user until then.
        for name, rules in sorted(users, key=lambda u: u[0] == "default"):
            await setup.execute_command("ACL", "SETUSER", name, *rules)
        await setup.aclose()
        c = Confined(server, namespace, Keys(namespace, Settings().shards))
        admin = c.connect("admin")
        for sid in (OWN, OTHER):
            await seed(admin, c.keys.session(sid), namespace)
        await admin.aclose()
        yield c


async def seed(admin: aioredis.Redis, sk: SessionKeys, namespace: str) -> None:
    """A session as a Brain leaves it: leased at fence 5, one entry, task, submission, and a
    dispatched run plus an applied one."""
    intent = {"run_id": "r1", "session_id": sk.session_id, "task_id": "t1", "tool": "echo",
              "operation_id": "op1", "wake_subject": f"{namespace}.wake.notices.1"}
    await admin.hset(sk.meta, mapping={
        "agent": "notices", "compat": 1, "wake": f"{namespace}.wake.notices.1", "fence": 5,
        "seq": 3, "holder": "brain-1", "lease_until": 0, "created": 1})
    await admin.rpush(sk.entries, json.dumps({"kind": "user", "text": "hello"}))
    await admin.hset(sk.tasks, "t1", json.dumps({"id": "t1"}))
    await admin.hset(sk.subs, "sub-1", json.dumps({"id": "sub-1", "text": "hello"}))
    await admin.hset(sk.intents, mapping={"r1": json.dumps(intent), "r1.status": "dispatched",
                                          "r1.cancel": 7})
    # a run awaiting an approval bound to its arguments' digest
    gated = {**intent, "run_id": "r2", "tool": "send_email", "approval_digest": "d-real"}
    await admin.hset(sk.intents, mapping={"r2": json.dumps(gated), "r2.digest": "d-real",
                                          "r2.status": "awaiting_approval"})
    await admin.hset(sk.runs_done, mapping={"r0.intent": json.dumps({**intent, "run_id": "r0"}),
                                            "r0.result": '{"outcome":"ok"}'})
    # what the Brain lists and arms in the shard's keys, and a pending row of its outbox
    await admin.zadd(sk.timers, {f"deadline|{sk.session_id}|-|{namespace}.wake.notices.1": 9})
    await admin.zadd(sk.sessions, {sk.session_id: 1})
    await admin.xadd(sk.outbox, {"id": f"{sk.session_id}/3/0", "sid": sk.session_id,
                                 "subj": f"{namespace}.tool.echo", "data": '{"secret": 1}'})


async def snapshot(c: Confined, sid: str) -> list[Any]:
    admin = c.connect("admin")
    sk = c.keys.session(sid)
    try:
        return [await admin.dump(k) for k in (*sk.all(), sk.outbox)]
    finally:
        await admin.aclose()


async def refused(c: Confined, act: Awaitable[Any], *sessions: str) -> None:
    """``act`` is refused by Redis (NOPERM, directly or inside a script) and changes nothing."""
    before = [await snapshot(c, s) for s in sessions or (OWN, OTHER)]
    with pytest.raises((ResponseError, BatonError)) as exc:
        await act
    text = str(exc.value)
    assert any(m in text for m in ("NOPERM", "no permissions", "can't access", "may not")), text
    assert [await snapshot(c, s) for s in sessions or (OWN, OTHER)] == before


async def as_role(c: Confined, role: str, act: Any, *sessions: str) -> None:
    r = c.connect(role)
    try:
        await refused(c, act(r), *sessions)
    finally:
        await r.aclose()


def sk(c: Confined, sid: str = OWN) -> SessionKeys:
    return c.keys.session(sid)


WAKE_ROW = ["id", "forged/1/0", "subj", "{ns}.wake.notices.1", "data", "{{}}", "sid", OWN]
TOOL_ROW = ["id", "forged/2/0", "subj", "{ns}.tool.send_email", "data", "{{}}", "sid", OWN]


def row(c: Confined, template: list[str]) -> dict[str, str]:
    fields = [f.format(ns=c.namespace) for f in template]
    return dict(zip(fields[::2], fields[1::2], strict=True))


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


def log_key(c: Confined, log: str, role: str, sid: str = OWN) -> str:
    """A role's liveness hash (``workers``) or dead-letter stream (``dead``) on the shard of
    ``sid``."""
    return f"{c.namespace}:{c.keys.tag(c.keys.shard_of(sid))}:{log}:{role}"


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


# --- Clients -------------------------------------------------------------------------------

async def test_client_cannot_read_another_sessions_entries(confined: Confined) -> None:
    await as_role(confined, "client", lambda r: r.lrange(sk(confined, OTHER).entries, 0, -1))


async def test_client_cannot_set_another_sessions_fence(confined: Confined) -> None:
    await as_role(confined, "client", lambda r: r.hset(sk(confined, OTHER).meta, "fence", 1))


async def test_client_cannot_delete_another_sessions_submission(confined: Confined) -> None:
    await as_role(confined, "client", lambda r: r.hdel(sk(confined, OTHER).subs, "sub-1"))


async def test_client_cannot_submit_into_another_session(confined: Confined) -> None:
    store = await Store.connect(confined.settings("client"))
    try:
        act = store.submit(
            OTHER, agent="notices", compat=1, wake_subject=f"{confined.namespace}.wake.n.1",
            request_id="r-x", text="forged", task=Task(id="tx", kind="generation", owner=OTHER),
            worker=worker_ref("client", "c"), submission_id="sub-x")
        await refused(confined, act)
    finally:
        await store.close()


async def test_client_cannot_hear_another_sessions_settlements(confined: Confined) -> None:
    r = confined.connect("client")
    pubsub = r.pubsub()
    try:
        own = confined.keys.settled_channel(OWN)
        await pubsub.execute_command("SSUBSCRIBE", own)  # its own: allowed
        other = confined.keys.settled_channel(OTHER)
        with pytest.raises(ResponseError, match="no permissions"):
            await r.execute_command("SSUBSCRIBE", other)
    finally:
        await pubsub.aclose()
        await r.aclose()


async def test_only_brains_announce_settlements(confined: Confined) -> None:
    """A settled notice carries the record a waiting client returns as its answer
    (baton.store.notices): no other role may send one, not even on a channel it may hear."""
    for role in ("client", "hands", "relay"):
        r = confined.connect(role)
        try:
            with pytest.raises(ResponseError, match="no permissions"):
                await r.execute_command("SPUBLISH", confined.keys.settled_channel(OWN),
                                        '{"id": "sub-forged", "status": "completed"}')
        finally:
            await r.aclose()


async def test_a_clients_cancel_writes_its_intent_and_no_brain_state(confined: Confined) -> None:
    """A cancel is a request in the session's inbox plus a wake hint: the session hash and
    the outbox are untouched, the Brain consumes the request in its own commit."""
    admin = confined.connect("admin")
    keys = sk(confined)
    before = [await admin.dump(k) for k in (keys.meta, keys.tasks, keys.outbox)]
    wakes = await admin.xlen(keys.wakes)
    client = await Store.connect(confined.settings("client"))
    try:
        answer = await client.decisions.cancel(OWN, "t1", worker_ref("client", "c"))
    finally:
        await client.close()
    try:
        assert answer.status == "requested"
        assert [await admin.dump(k) for k in (keys.meta, keys.tasks, keys.outbox)] == before
        assert await admin.hexists(keys.inbox, "cancel:t1")
        assert await admin.get(keys.nudge) == "1"
        assert await admin.xlen(keys.wakes) == wakes + 1
    finally:
        await admin.delete(keys.inbox, keys.nudge)
        await admin.aclose()


async def test_a_clients_approval_writes_its_decision_and_no_brain_state(
    confined: Confined,
) -> None:
    """An approval is a decision in the session's inbox plus a wake hint: the run's status,
    the session hash and the outbox are the Brain's to change when it carries it out."""
    admin = confined.connect("admin")
    keys = sk(confined)
    owned = (keys.meta, keys.intents, keys.runs, keys.outbox)
    before = [await admin.dump(k) for k in owned]
    client = await Store.connect(confined.settings("client"))
    try:
        await client.decisions.approve(BusNames(confined.namespace), OWN, "r2", "d-real",
                                       worker_ref("client", "c"))
        with pytest.raises(ConflictError, match="approved already"):
            await client.decisions.approve(BusNames(confined.namespace), OWN, "r2", "d-real",
                                           worker_ref("client", "c"))
    finally:
        await client.close()
    try:
        assert [await admin.dump(k) for k in owned] == before
        assert json.loads(await admin.hget(keys.inbox, "decide:r2"))["decision"] == "approve"
    finally:
        await admin.delete(keys.inbox, keys.nudge)
        await admin.aclose()


async def test_client_cannot_list_the_keyspace(confined: Confined) -> None:
    await as_role(confined, "client", lambda r: r.scan(0))
    await as_role(confined, "client", lambda r: r.keys("*"))


async def test_client_cannot_add_a_tool_row_to_the_outbox(confined: Confined) -> None:
    await as_role(confined, "client", lambda r: r.xadd(sk(confined).outbox,
                                                       row(confined, TOOL_ROW)))


async def test_client_cannot_remove_another_sessions_timer(confined: Confined) -> None:
    member = f"deadline|{OTHER}|-|{confined.namespace}.wake.notices.1"
    await as_role(confined, "client", lambda r: r.zrem(sk(confined, OTHER).timers, member))


async def test_client_cannot_arm_a_timer(confined: Confined) -> None:
    member = f"deadline|{OWN}|-|{confined.namespace}.wake.notices.1"
    await as_role(confined, "client", lambda r: r.zadd(sk(confined).timers, {member: 1}))


async def test_client_cannot_unlist_a_session_from_the_index(confined: Confined) -> None:
    await as_role(confined, "client", lambda r: r.zrem(sk(confined, OTHER).sessions, OTHER))
    await as_role(confined, "client", lambda r: r.hdel(sk(confined, OTHER).sessions, OTHER))


async def test_client_cannot_list_a_session_in_the_index(confined: Confined) -> None:
    await as_role(confined, "client", lambda r: r.zadd(sk(confined).sessions, {"acme-x": 1}))
    await as_role(confined, "client", lambda r: r.hset(sk(confined).sessions, "acme-x", 1))


async def test_client_cannot_read_the_outbox(confined: Confined) -> None:
    """The shard's pending rows (tool arguments of other sessions among them)."""
    await as_role(confined, "client", lambda r: r.xrange(sk(confined).outbox))
    await as_role(confined, "client", lambda r: r.xread({sk(confined).outbox: "0-0"}))


async def test_a_clients_submit_writes_no_shard_index_or_timer(confined: Confined) -> None:
    """A submit for a new session of the client's grant writes only the session's inbox,
    nudge, receipt and a wake row: the Brain lists the session and arms its deadline when it
    takes the request up."""
    admin = confined.connect("admin")
    keys = sk(confined, "acme-new")
    shard = [await admin.dump(k) for k in (keys.timers, keys.sessions, keys.outbox)]
    client = await Store.connect(confined.settings("client"))
    try:
        _, created = await client.submit(
            "acme-new", agent="notices", compat=1,
            wake_subject=f"{confined.namespace}.wake.notices.1", request_id="r-new",
            text="hello", task=Task(id="t-new", kind="generation", owner="acme-new"),
            worker=worker_ref("client", "c"), submission_id="sub-new")
    finally:
        await client.close()
    try:
        assert created
        assert [await admin.dump(k) for k in (keys.timers, keys.sessions, keys.outbox)] == shard
        assert await admin.hexists(keys.inbox, "submit:r-new")
    finally:
        await admin.delete(keys.inbox, keys.nudge, keys.receipts)
        await admin.aclose()


async def test_client_cannot_write_brain_state_of_its_own_session(confined: Confined) -> None:
    await as_role(confined, "client", lambda r: r.hset(sk(confined).meta, "fence", 1))


# --- Brains --------------------------------------------------------------------------------

async def test_brain_cannot_claim_a_tool_run(confined: Confined) -> None:
    store = await Store.connect(confined.settings("brain"))
    try:
        await refused(confined, store.runs.claim(OWN, "r1", worker_ref("brain", "b")))
    finally:
        await store.close()


async def test_brain_cannot_complete_a_tool_run(confined: Confined) -> None:
    await as_role(confined, "brain", lambda r: r.hset(
        sk(confined).runs, mapping={"r1.status": "completed", "r1.result": '{"outcome":"ok"}'}))


async def test_brain_cannot_flush_or_reconfigure(confined: Confined) -> None:
    await as_role(confined, "brain", lambda r: r.flushall())
    await as_role(confined, "brain", lambda r: r.execute_command("CONFIG", "SET", "save", ""))


# --- Relay ---------------------------------------------------------------------------------

async def test_relay_cannot_write_entries_tasks_or_runs(confined: Confined) -> None:
    await as_role(confined, "relay", lambda r: r.rpush(sk(confined).entries, "{}"))
    await as_role(confined, "relay", lambda r: r.hset(sk(confined).tasks, "t1", "{}"))
    await as_role(confined, "relay", lambda r: r.hset(sk(confined).runs, "r1.status", "x"))


async def test_relay_cannot_read_session_state(confined: Confined) -> None:
    await as_role(confined, "relay", lambda r: r.lrange(sk(confined).entries, 0, -1))
    await as_role(confined, "relay", lambda r: r.hgetall(sk(confined).subs))


async def test_relay_cannot_set_a_fence(confined: Confined) -> None:
    await as_role(confined, "relay", lambda r: r.hset(sk(confined).meta, "fence", 1))


# --- Credentials ---------------------------------------------------------------------------

@pytest.mark.parametrize("role", ROLES)
async def test_a_wrong_password_is_refused(confined: Confined, role: str) -> None:
    r = aioredis.Redis.from_url(confined.url(role, "guess"))
    try:
        with pytest.raises(AuthenticationError):
            await r.ping()
    finally:
        await r.aclose()
    bad = confined.settings(role).model_copy(update={"redis_url": confined.url(role, "guess")})
    with pytest.raises(CredentialsError):
        await Store.connect(bad)


async def test_no_password_is_refused(confined: Confined) -> None:
    r = aioredis.Redis.from_url(confined.server.url)  # the default user, which is off
    try:
        with pytest.raises((AuthenticationError, ResponseError), match=r"NOAUTH|NOPERM|auth"):
            await r.get(f"{confined.namespace}:x")
    finally:
        await r.aclose()


async def test_inspect_with_a_client_credential_names_what_it_may_not_read(
    confined: Confined,
) -> None:
    """``baton inspect`` as a client (the CLI's user on a secure dev stack) shows the
    session and one line per shard-wide log it may not read, not one error per key."""
    from baton.cli.inspect import cluster_view, session_view
    store = await Store.connect(confined.settings("client"))
    try:
        session = await session_view(store, OWN)
        cluster = await cluster_view(store)
    finally:
        await store.close()
    refused = [f for f in session["findings"] + cluster["findings"]
               if "not readable with this credential" in f]
    assert {f.partition(":")[0] for f in refused} == {"dead letters", "timers key", "outbox",
                                                      "sessions index"}, refused
    assert len(cluster["findings"]) == 3, cluster["findings"]


async def test_the_relays_inbox_sweep_runs_under_its_own_user(confined: Confined) -> None:
    """The relay finds a session whose inbox holds a request (SCAN, HKEYS) and arms its
    deadline; it leaves a quarantined session alone; and it may not write the inbox."""
    from baton.store.outbox import Outbox
    keys = sk(confined, "acme-swept")
    admin = confined.connect("admin")
    relay = confined.connect("relay")
    box = Outbox(relay, confined.keys)
    member = f"deadline|acme-swept|-|{confined.namespace}.wake.notices.1"
    try:
        await admin.hset(keys.inbox, "submit:r1", json.dumps(
            {"agent": "notices", "wake": f"{confined.namespace}.wake.notices.1"}))
        lease = await box.lease("acquire", keys.shard, "relay-sweep", 60_000)
        assert lease.ok
        waiting = await box.waiting_requests([keys.shard])
        assert "acme-swept" in waiting[keys.shard]
        assert await box.arm_requests(keys.shard, ["acme-swept"], "relay-sweep",
                                      lease.fence, 1000) == 1
        assert await admin.zscore(keys.timers, member) is not None
        assert await admin.zscore(keys.sessions, "acme-swept") is not None  # not opened yet
        await admin.zrem(keys.timers, member)
        await admin.hset(keys.poison, "quarantined", 1)
        assert await box.arm_requests(keys.shard, ["acme-swept"], "relay-sweep",
                                      lease.fence, 1000) == 0
        await refused(confined, relay.hdel(keys.inbox, "submit:r1"), "acme-swept")
    finally:
        await admin.zrem(keys.timers, member)
        await admin.zrem(keys.sessions, "acme-swept")
        await admin.delete(keys.inbox, keys.poison, confined.keys.relay_lease(keys.shard))
        await relay.aclose()
        await admin.aclose()


async def test_a_client_names_its_watch_connection_and_reads_its_session(
    confined: Confined,
) -> None:
    """``baton watch`` as the client (no operator configured) names its connection (CLIENT
    SETNAME, which Redis refused the client before) and reads its own session's log."""
    from baton.store.redis_client import connect_redis

    r = connect_redis(confined.settings("client"), client_name=f"baton-watch:{OWN}")
    try:
        assert await r.lrange(sk(confined).entries, 0, -1)
        admin = confined.connect("admin")
        try:
            named = [c for c in await admin.client_list() if c["name"] == f"baton-watch:{OWN}"]
        finally:
            await admin.aclose()
        assert [c["user"] for c in named] == ["client"]
    finally:
        await r.aclose()
