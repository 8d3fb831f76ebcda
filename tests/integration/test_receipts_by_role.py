"""Receipts confined by role (issue 46, finding 8): each role appends to a receipts stream
of its own, where only its Redis ACL user may write, and readers merge the three.

Against a real redis-server with the users of the deploy ACL file (tests/integration/
confinement.py) and, for the five-notice flow, real NATS and every service under its own
users (the ``secured`` servers of test_permissions.py): a Hands or a client cannot append a
receipt to another role's stream (Redis refuses it, NOPERM), what it writes to its own is
attributed to its own role whatever it claims, and the trace reads the three streams merged
in the order they were written.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import NoPermissionError

from baton.cli.trace import build_trace
from baton.devkit.mailbox import MailboxServer
from baton.models import Task
from baton.receipts import id_order
from baton.store.keys import SessionKeys
from baton.store.store import Store, worker_ref
from tests.helpers import contents
from tests.integration.confinement import OTHER, OWN, Confined, sk
from tests.integration.test_permissions import (  # noqa: F401 (secured: a fixture)
    Secured,
    five_notices_as_roles,
    secured,
)


def forged(role: str, kind: str = "commit") -> dict[str, str]:
    """A receipt as the scripts write one, claiming ``role``'s worker."""
    return {"seq": "99", "kind": kind, "worker": f'{{"role":"{role}","name":"{role}-x","pid":1}}',
            "fence": "99", "ts": "1", "data": '{"detail":{"step":"final"}}'}


async def streams(c: Confined, keys: SessionKeys) -> list[Any]:
    admin = c.connect("admin")
    try:
        return [await contents(admin, key) for _, key in keys.receipt_streams()]
    finally:
        await admin.aclose()


async def refused(c: Confined, role: str, key: str, keys: SessionKeys) -> None:
    """``role``'s XADD to ``key`` is refused by Redis itself, and no stream changes."""
    before = await streams(c, keys)
    r = c.connect(role)
    try:
        with pytest.raises(NoPermissionError):
            await r.xadd(key, forged("brain"))
    finally:
        await r.aclose()
    assert await streams(c, keys) == before


async def test_the_hands_user_may_not_append_to_the_brains_or_clients_receipts(
        confined: Confined) -> None:
    for sid in (OWN, OTHER):
        keys = sk(confined, sid)
        await refused(confined, "hands", keys.receipts, keys)
        await refused(confined, "hands", keys.receipts_client, keys)
    # its own stream takes what it writes (and readers attribute that to the Hands)
    hands = confined.connect("hands")
    try:
        assert await hands.xadd(sk(confined).receipts_hands, forged("hands", "claim"))
    finally:
        await hands.aclose()


async def test_the_client_user_may_not_append_to_the_brains_or_hands_receipts(
        confined: Confined) -> None:
    keys = sk(confined)
    await refused(confined, "client", keys.receipts, keys)
    await refused(confined, "client", keys.receipts_hands, keys)
    # nor to the clients' stream of a session outside its grant
    other = sk(confined, OTHER)
    await refused(confined, "client", other.receipts_client, other)
    client = confined.connect("client")
    try:
        assert await client.xadd(keys.receipts_client, forged("client", "cancel"))
    finally:
        await client.aclose()


async def test_a_receipt_follows_the_newest_of_every_roles_stream(confined: Confined) -> None:
    """The three streams' ids are one order: a client's submit after a Hands' receipt whose
    id is ahead of the clock gets an id past it, so a reader that merges the streams by id
    (and resumes after one id in all three) sees them in the order they were written. Nor
    does the Hands' receipt make the new session look corrupt (meta gone, receipts left): a
    role cannot block a session by writing its own stream."""
    sid = "acme-order"
    keys = sk(confined, sid)
    hands = confined.connect("hands")
    ahead = await hands.xadd(keys.receipts_hands, forged("hands", "claim"),
                             id="99999999999990-7")
    await hands.aclose()
    client = await Store.connect(confined.settings("client"))
    try:
        task = Task(id="gen-1", kind="generation", owner=sid, submission_id="sub-1",
                    input={"agent": "notices"}, created_ms=1)
        await client.inbox.submit(
            sid, agent="notices", compat=1, wake_subject=f"{confined.namespace}.wake.notices.1",
            request_id="r-1", text="hello", task=task, submission_id="sub-1",
            worker=worker_ref("client", "c"))
        receipts = await client.receipts(sid)
    finally:
        await client.close()
    assert [(r.stream_role, r.kind) for r in receipts] == [("hands", "claim"),
                                                          ("client", "submit")]
    assert id_order(receipts[1].stream_id) > id_order(str(ahead))
    admin = confined.connect("admin")
    assert not await admin.exists(keys.receipts)  # none in the Brains'
    await admin.aclose()


async def test_five_notices_leave_each_roles_receipts_in_its_stream_merged_in_order(
        secured: Secured) -> None:  # noqa: F811 (the fixture imported above)
    async with MailboxServer() as mailbox:
        final = await five_notices_as_roles(secured, mailbox)
    assert final.status == "completed", final
    operator = await Store.connect(secured.settings("operator"))
    try:
        receipts = await operator.receipts(final.session_id)
        keys = operator.keys.session(final.session_id)
        brains = await operator.redis.xrange(keys.receipts)
        # A Hands forging a Brain's final commit can write it only to its own stream.
        forger = await Store.connect(secured.settings("hands"))
        try:
            with pytest.raises(NoPermissionError):
                await forger.redis.xadd(keys.receipts, forged("brain"))
            await forger.redis.xadd(keys.receipts_hands, forged("brain"))
        finally:
            await forger.close()
        after = await operator.receipts(final.session_id)
    finally:
        await operator.close()
    # every role wrote its own receipts, as itself, and the merged ids are one order
    by_role = {role: {r.kind for r in receipts if r.role == role}
               for role in ("brain", "hands", "client")}
    assert by_role["client"] == {"submit"}
    assert {"claim", "complete"} <= by_role["hands"] <= {"claim", "reclaim", "complete",
                                                        "refused"}
    assert {"lease", "commit"} <= by_role["brain"]
    assert all(r.worker and r.worker.role == r.stream_role == r.role for r in receipts)
    assert not any(r.mismatch or r.foreign for r in receipts)
    ids = [id_order(r.stream_id) for r in receipts]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert receipts[0].kind == "submit" and receipts[-1].kind == "commit"
    # the Brains' stream holds the Brains' receipts only
    assert {f["kind"] for _, f in brains} <= {"lease", "takeover", "held", "commit",
                                              "partial", "refused"}
    trace = build_trace(final.session_id, receipts)
    assert {lane.role for lane in trace.lanes} - {"relay"} == {"client", "brain", "hands"}
    claims = [e for e in trace.events if e.kind == "claim"]
    assert len(claims) == 5 and all(trace.lanes_by_id[e.lane].role == "hands" for e in claims)
    # the forged "Brain's commit" is shown as the Hands', flagged, and not read as a commit
    fake = after[-1]
    assert (fake.stream_role, fake.role, fake.mismatch, fake.foreign) == (
        "hands", "hands", True, True)
    ev = build_trace(final.session_id, after).events[-1]
    assert "forged" in ev.flags and "role-mismatch" in ev.flags
    lane = build_trace(final.session_id, after).lanes_by_id[ev.lane]
    assert lane.role == "hands" and "claims brain" in lane.name
