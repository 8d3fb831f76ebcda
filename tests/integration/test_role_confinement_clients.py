"""What a client's Redis credential cannot do, tried as an attacker would, one act per test
(see test_role_confinement.py)."""

from __future__ import annotations

import asyncio
import json

import pytest
from redis.exceptions import ResponseError

from baton.bus.subjects import BusNames
from baton.errors import ConflictError
from baton.models import Task
from baton.store.store import Store, worker_ref
from tests.helpers import contents
from tests.integration.confinement import (
    OTHER,
    OWN,
    TOOL_ROW,
    Confined,
    as_role,
    hold_as_brain,
    refused,
    row,
    sk,
)

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
        act = store.inbox.submit(
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
    before = [await contents(admin, k) for k in (keys.meta, keys.tasks, keys.outbox)]
    wakes = await admin.xlen(keys.wakes)
    client = await Store.connect(confined.settings("client"))
    try:
        answer = await client.decisions.cancel(OWN, "t1", worker_ref("client", "c"))
    finally:
        await client.close()
    try:
        assert answer.status == "requested"
        assert [await contents(admin, k) for k in (keys.meta, keys.tasks, keys.outbox)] == before
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
    before = [await contents(admin, k) for k in owned]
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
        assert [await contents(admin, k) for k in owned] == before
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


async def test_client_cannot_read_the_wakes_stream(confined: Confined) -> None:
    """It appends its requests' wakes there, but the rows name every session of the shard
    (ids, request ids, subjects), the other tenants' too: write only, also from a script."""
    wakes = sk(confined, OTHER).wakes
    admin = confined.connect("admin")
    try:
        await admin.xadd(wakes, {"id": f"{OTHER}/1/s.secret", "sid": OTHER})
    finally:
        await admin.aclose()
    await as_role(confined, "client", lambda r: r.xrange(wakes))
    await as_role(confined, "client", lambda r: r.xread({wakes: "0-0"}))
    await as_role(confined, "client", lambda r: r.xrevrange(wakes))
    script = "return redis.call('XRANGE', KEYS[1], '-', '+')"
    await as_role(confined, "client", lambda r: r.eval(script, 1, wakes))
    inbox = sk(confined, OWN).inbox  # a key of its own, and the wakes of another shard
    undeclared = f"return redis.call('XRANGE', '{wakes}', '-', '+')"
    await as_role(confined, "client", lambda r: r.eval(undeclared, 1, inbox))


async def test_a_clients_submit_writes_no_shard_index_or_timer(confined: Confined) -> None:
    """A submit for a new session of the client's grant writes only the session's inbox,
    nudge, receipt and a wake row: the Brain lists the session and arms its deadline when it
    takes the request up."""
    admin = confined.connect("admin")
    keys = sk(confined, "acme-new")
    shard = [await admin.dump(k) for k in (keys.timers, keys.sessions, keys.outbox)]
    client = await Store.connect(confined.settings("client"))
    try:
        _, created = await client.inbox.submit(
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


async def test_a_clients_request_tells_the_brain_that_holds_its_session(
    confined: Confined,
) -> None:
    """A confined client may speak on hold channels (a selector grants SPUBLISH there and
    nothing else: test_only_brains_hear_held_channels), so its request to a held session
    ends the hold at once."""
    brain, held, listener = await hold_as_brain(confined)
    client = await Store.connect(confined.settings("client"))
    try:
        waiting = asyncio.create_task(held.hold(OWN))
        await client.inbox.submit(
            OWN, agent="notices", compat=1, wake_subject=f"{confined.namespace}.wake.notices.1",
            request_id="r-held", text="one more", task=Task(id="t-held", kind="generation",
                                                            owner=OWN),
            worker=worker_ref("client", "c"), submission_id="sub-held")
        heard = await asyncio.wait_for(waiting, 10)  # long before the hold's end
        assert heard is not None, "the hold ran its length: no signal came"
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        await client.close()
        await brain.close()
