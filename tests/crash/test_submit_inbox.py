"""A submission is a request in the session's inbox until a Brain's commit takes it up: a
Brain killed after its wake, before its commit, leaves the request there, and the next Brain
writes the entry, the submission and the task once.

Topology: one Redis server (the inbox is the same keys on a cluster; the cancel and approval
crash tests run the cluster case of the same pattern).
"""

from __future__ import annotations

import pytest

from baton.receipts import CommitDetail
from tests.crash.conftest import FIVE_NOTICES, Opener

pytestmark = [pytest.mark.crash, pytest.mark.timeout(90)]


async def test_a_submission_waits_for_a_brain_killed_before_taking_it_up(
    crash: Opener,
) -> None:
    c = await crash(brains=0, hands=1)
    armed = await c.spawn_armed("brain", "brain.after_wake")
    sub = await c.submit(FIVE_NOTICES)
    await c.died_at(armed.name, "brain.after_wake")
    sk = c.store.keys.session(sub.session_id)
    assert await c.store.redis.hexists(sk.inbox, f"submit:{sub.request_id}")  # not lost
    assert not await c.store.redis.exists(sk.entries)  # nothing written for it yet
    await c.replace(armed.name)
    final = await c.settle(sub)
    assert final.status == "completed", final
    assert not await c.store.redis.exists(sk.inbox)  # taken up ...
    taken = [r for r in await c.store.receipts(sub.session_id)
             if isinstance(r.detail, CommitDetail) and r.detail.step == "requests"]
    assert len(taken) == 1, taken  # ... once
    entries = await c.store.entries(sub.session_id)
    assert [e.text for e in entries if e.kind == "user"] == [FIVE_NOTICES]
    stats = await c.stats()
    assert sum(stats["deliveries"].values()) == 5, stats
