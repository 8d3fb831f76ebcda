"""Five-notice sessions on a stack whose servers and services each run in their own network
namespace (``DevStack(cluster=True, netns=True)``: 3+6 Redis Cluster, 3 NATS nodes, every
Brain, Hands and relay), with links cut mid-run:

* a NATS node isolated from everyone;
* a Hands cut off from every NATS node, not from Redis, while it runs a tool;
* a Brain cut off from every Redis node while it holds a session's lease.

Each time the session completes and every recipient gets exactly one mail.
"""

from __future__ import annotations

from typing import Any

import pytest

from baton.devkit.redis_cluster import ClusterStack
from baton.receipts import Receipt
from tests.crash.conftest import RECIPIENTS, Crash, Opener
from tests.helpers import eventually

pytestmark = pytest.mark.partition

SETTLE_S = 60.0


async def _one_mail_each(c: Crash) -> dict[str, Any]:
    stats = await c.stats()
    assert stats["deliveries"] == {r: 1 for r in RECIPIENTS}, stats
    assert stats["accepted"] == len(RECIPIENTS), stats
    return stats


async def test_an_isolated_nats_node_loses_no_session(crash: Opener) -> None:
    c = await crash(cluster=True, netns=True, hands=2, mail_delay_ms=200)
    net = c.stack.net
    assert net is not None
    sub = await c.submit()
    await eventually(lambda: _accepted_at_least(c, 1), timeout=30)
    net.isolate(ClusterStack.NATS_MEMBERS[0])
    final = await c.settle(sub, timeout=SETTLE_S)
    await c.check_completed(final)
    await _one_mail_each(c)
    net.heal()


async def _accepted_at_least(c: Crash, n: int) -> bool:
    return int((await c.stats())["accepted"]) >= n


async def _held(c: Crash) -> bool:
    return int((await c.stats())["held"]) >= 1


async def test_a_hands_cut_off_from_nats_mid_tool_finishes_through_redis(
    crash: Opener,
) -> None:
    c = await crash(cluster=True, netns=True, hands=2)
    net = c.stack.net
    assert net is not None
    await c.http.post("/hold")
    sub = await c.submit()
    await eventually(lambda: _held(c), timeout=30)
    runs = await eventually(lambda: _running(c, sub.session_id), timeout=30)
    hands = next(p for p in c.stack.procs("hands") if p.name in (runs[0].worker or ""))
    # Its tool is running; it keeps Redis, loses NATS (the ack of the message it holds).
    net.split([hands.member], ClusterStack.NATS_MEMBERS)
    await c.http.post("/release")
    final = await c.settle(sub, timeout=SETTLE_S)
    await c.check_completed(final)
    await _one_mail_each(c)
    net.heal()


async def _running(c: Crash, session: str) -> list[Any]:
    return [r for r in await c.runs(session) if r.worker and r.status != "completed"]


async def test_a_brain_cut_off_from_redis_mid_lease_is_taken_over(crash: Opener) -> None:
    # The slow model stalls each model call for half the lease time: the window to cut in.
    c = await crash(cluster=True, netns=True, brains=2, hands=2,
                    app_spec="tests.apps:slow_app", env={"TEST_MODEL_DELAY_MS": "500"})
    net = c.stack.net
    assert net is not None
    sub = await c.submit()
    session = sub.session_id
    for _ in range(5):
        brain, fence = await eventually(lambda: c.brain_in_request(session), timeout=30,
                                        message="a Brain in the model call")
        net.split([c.stack.proc(brain).member], ClusterStack.REDIS_MEMBERS)
        if await c.brain_in_request(session) == (brain, fence):
            break
        net.heal()  # too late: it committed already; cut in the next model call
    else:
        raise AssertionError("never cut a Brain inside the model call")

    async def taken_over() -> Receipt | None:
        found = [r for r in await c.receipts(session, "takeover") if r.fence > fence]
        return found[0] if found else None

    takeover = await eventually(taken_over, timeout=30, message="another Brain took over")
    assert getattr(takeover.detail, "previous_holder", None) == brain
    final = await c.settle(sub, timeout=SETTLE_S)
    await c.check_completed(final)
    await _one_mail_each(c)
    entries = len(await c.entries(session))
    net.heal()
    # Whatever the cut Brain still held is fenced: the settled result does not change.
    assert (await c.store.inbox.submission(session, sub.id)) == final
    assert len(await c.entries(session)) == entries
