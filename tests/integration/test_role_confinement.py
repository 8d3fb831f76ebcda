"""What each role's Redis credential cannot do, tried as an attacker would, one act per test.

A private Redis gets the users of the ACL file that ``baton auth`` writes for
deploy/ (:func:`baton.auth.redis_acl_file`, rendered the way deploy/redis/start.sh does:
comments dropped, ``${ROLE_REDIS_PASSWORD}`` filled in), here with the client granted the
sessions ``acme-*`` only. Each test logs in as one role and tries one forbidden act with
plain Redis commands (or a script of its own), and checks that Redis refuses it and that the
session's keys are unchanged.

"""

from __future__ import annotations

import json

import pytest
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, ResponseError

from baton.auth import ROLES
from baton.errors import CredentialsError
from baton.store.store import Store, worker_ref
from tests.integration.confinement import (
    OWN,
    Confined,
    as_role,
    refused,
    sk,
)

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
    # "0 sessions (none)" read as an empty store: the count is unknown, and says so
    from rich.console import Console

    from baton.cli.inspect import render_cluster

    assert cluster["sessions_total"] is None
    console = Console(width=120, record=True)
    render_cluster(cluster, console)
    assert "sessions: not readable with this credential" in console.export_text()


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


async def test_the_relay_samples_the_outbox_backlog_under_its_own_user(
        confined: Confined) -> None:
    """The backlog gauges (rows and the oldest row's age per shard) read as the relay: with
    the shipped ACL its XRANGE was refused and the gauges stayed empty."""
    from baton.store.outbox import Outbox
    keys = sk(confined, "acme-backlog")
    admin = confined.connect("admin")
    relay = confined.connect("relay")
    row = await admin.xadd(keys.outbox, {"id": "acme-backlog/1/0", "subj": "x", "data": "{}"})
    try:
        backlog = {b.shard: b for b in await Outbox(relay, confined.keys).backlog()}
        mine = backlog[keys.shard]
        assert mine.rows >= 1 and mine.oldest_ms is not None
        assert mine.oldest_ms <= int(str(row).split("-")[0])
    finally:
        await admin.xdel(keys.outbox, row)
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


async def test_fair_admission_runs_under_each_roles_own_user(confined: Confined) -> None:
    """A client's submissions join the shard's admission queue, the relay's sweep leaves a
    queued session alone, a Brain lets the next one through, the operator reads the backlog:
    each under its own user (baton.store.admission)."""
    from baton.client import Client
    from baton.store.admission import AdmissionQueue
    from baton.store.outbox import Outbox

    first = "acme-adm-0"
    shard = confined.keys.shard_of(first)
    second = next(f"acme-adm-{i}" for i in range(1, 1000)
                  if confined.keys.shard_of(f"acme-adm-{i}") == shard)
    window = {"admission_window": confined.keys.shards}  # one starting session per shard
    client = await Client.connect(confined.settings("client").model_copy(update=window))
    client.warn_unserved = False
    admin = confined.connect("admin")
    relay = confined.connect("relay")
    brain = await Store.connect(confined.settings("brain").model_copy(update=window))
    try:
        for sid in (first, second):
            _, created = await client.submit("hello", agent="notices", session_id=sid,
                                             tenant="acme")
            assert created
        _, _, fly, queue = confined.keys.admission(shard)
        assert await admin.zscore(fly, first) is not None
        assert await admin.zscore(queue, second) is not None
        box = Outbox(relay, confined.keys)
        lease = await box.lease("acquire", shard, "relay-adm", 60_000)
        assert await box.arm_requests(shard, [second], "relay-adm", lease.fence, 1000) == 0
        admission = AdmissionQueue(brain.redis, brain.keys, brain.settings)
        assert await admission.received(first) == 1
        assert await admin.zscore(fly, second) is not None
        rows = await admin.xrange(confined.keys.outbox(shard))
        assert any(fields.get("sid") == second for _, fields in rows), rows
        operator = await Store.connect(confined.settings("operator"))
        try:
            backlog = await AdmissionQueue(operator.redis, operator.keys,
                                           operator.settings).backlog()
        finally:
            await operator.close()
        assert backlog.tenants == {"acme": 1} and backlog.starting == 1, backlog
    finally:
        await admin.delete(*confined.keys.admission(shard), confined.keys.relay_lease(shard))
        await client.close()
        await brain.close()
        await relay.aclose()
        await admin.aclose()
