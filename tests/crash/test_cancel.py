"""Cancellation with real processes: the intent is committed first, tool runs in flight learn
of it through their heartbeat and stop, runs never claimed are cancelled by the Brain's
commit, children are aborted bottom-up, and the work settles ``cancelled``; nothing is sent.
A cancel and an approval are requests in the session's inbox that survive a Brain killed
before it took them up.

Topologies: every test runs on one Redis server;
test_cancel_generation_mid_tool_stops_runs_through_heartbeat also runs on a 3+6 Redis
Cluster (DevStack(cluster=True)), the file's representative case (a cluster stack takes
seconds to start; the suite's time allows one per file).
"""

from __future__ import annotations

import pytest

from baton.models import ToolRun
from tests.conftest import TOPOLOGIES
from tests.crash.conftest import FIVE_NOTICES, RECIPIENTS, Crash, Opener
from tests.helpers import eventually

pytestmark = [pytest.mark.crash, pytest.mark.timeout(90)]

TWO = "Send the approved notice to ada@example.com and grace@example.com, then summarise."
# The tools wait 20 s before they would send; two run at a time, the rest wait unclaimed.
SLOW = {"TEST_SEND_DELAY_MS": "20000", "BATON_HANDS_CONCURRENCY": "2"}


async def _two_running(c: Crash, sid: str) -> list[ToolRun]:
    async def running() -> list[ToolRun]:
        runs = (await c.store.load(sid)).runs.values()
        found = [r for r in runs if r.status == "running"]
        return found if len(found) == 2 else []
    return await eventually(running, timeout=20, message="two runs claimed")


async def _all_handled(c: Crash, n: int) -> None:
    """Every tool message was handled by Hands (none left to send anything later)."""
    async def handled() -> bool:
        return len(c.events("hands-1", "tool_message_handled")) >= n
    await eventually(handled, timeout=20, message=f"{n} tool messages handled")


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_cancel_generation_mid_tool_stops_runs_through_heartbeat(
    crash: Opener, topology: str
) -> None:
    c = await crash(brains=1, hands=1, app_spec="tests.control_apps:slow_app", env=SLOW)
    sub = await c.submit(FIVE_NOTICES)
    claimed = await _two_running(c, sub.session_id)
    answer = await c.client.cancel(sub.session_id)
    assert answer.status == "requested"
    final = await c.settle(sub)
    assert final.status == "cancelled", final
    await _all_handled(c, 5)
    runs = await c.runs(sub.session_id)
    assert len(runs) == 5, runs
    assert all(r.result and r.result.outcome == "cancelled" for r in runs), [
        (r.run_id, r.status, r.attempt, r.result) for r in runs]
    stopped = {r.run_id for r in runs if r.attempt == 1}
    assert stopped == {r.run_id for r in claimed}  # told by their heartbeat, then completed
    assert all(r.result and "while running" in (r.result.error or "") for r in runs
               if r.run_id in stopped)
    assert all(r.attempt == 0 for r in runs if r.run_id not in stopped)  # never claimed
    assert len(c.events("hands-1", "tool_cancelled")) == 2
    outcomes = [e["outcome"] for e in c.events("hands-1", "tool_message_handled")]
    assert sorted(outcomes) == ["cancelled", "cancelled", "duplicate", "duplicate", "duplicate"]
    lines = [e for e in c.events("hands-1", "tool_message_handled") if e["outcome"] != "duplicate"]
    assert all(e["error_code"] == "cancelled" and "while running" in e["error"]
               for e in lines), lines  # the line says what the result says
    assert (await c.stats())["raw_requests"] == 0  # nothing was sent
    task = await c.store.inbox.task(sub.session_id, sub.task_id)
    assert task.state.name == "terminal" and task.state.outcome == "cancelled"
    kinds = [r.kind for r in await c.receipts(sub.session_id)]
    assert kinds.count("cancel") == 1
    assert (await c.client.cancel(sub.session_id)).status == "finished"


async def test_cancel_notice_batch_aborts_children_bottom_up(crash: Opener) -> None:
    c = await crash(brains=1, hands=1, app_spec="tests.control_apps:slow_batch_app", env=SLOW)
    sid, tid, _ = await c.client.start_task(
        None, "notice-batch",
        {"recipients": list(RECIPIENTS), "subject": "Notice", "body": "Approved."},
        agent="notice-batch")
    await _two_running(c, sid)
    first = await c.client.cancel(sid, tid)
    second = await c.client.cancel(sid, tid)
    assert first.status == "requested" and second.status in ("pending", "finished")
    task = await c.client.wait_task(sid, tid, timeout=30)
    assert task.state.name == "terminal" and task.state.outcome == "cancelled", task.state
    await _all_handled(c, 5)
    done = await c.store.finished_tasks(sid)
    children = [t for t in done.values() if t.parent == tid]
    assert len(children) == 5
    assert all(ch.state.outcome == "aborted" and ch.cancel_requested for ch in children)
    # Bottom-up: every child ended before its parent's terminal commit.
    receipts = await c.receipts(sid)
    ended = {r.detail.task_id: i for i, r in enumerate(receipts)
             if getattr(r.detail, "state", None) == "terminal"}
    assert all(ended[ch.id] < ended[tid] for ch in children), ended
    runs = await c.runs(sid)
    assert len(runs) == 5 and all(r.result and r.result.outcome == "cancelled" for r in runs)
    assert (await c.stats())["raw_requests"] == 0  # no delivery after the cancel
    assert (await c.client.cancel(sid, tid)).status == "finished"
    assert (await c.store.load(sid)).tasks == {}


async def test_a_cancel_request_waits_for_a_brain_killed_before_taking_it_up(
    crash: Opener,
) -> None:
    """A cancel is a request in the session's inbox until a Brain's commit takes it up: a
    Brain killed after the wake, before any commit, leaves it there, and the next Brain
    takes it up exactly once."""
    c = await crash(brains=1, hands=1, app_spec="tests.control_apps:slow_app", env=SLOW)
    sub = await c.submit(FIVE_NOTICES)
    await _two_running(c, sub.session_id)
    c.stack.kill("brain-1", respawn=False)
    await c.stack.wait_exit("brain-1")
    # Requested while no Brain runs: the armed one is woken with the cancel in the inbox.
    assert (await c.client.cancel(sub.session_id)).status == "requested"
    armed = await c.spawn_armed("brain", "brain.after_wake")
    await c.died_at(armed.name, "brain.after_wake")
    sk = c.store.keys.session(sub.session_id)
    assert await c.store.redis.hexists(sk.inbox, "cancel:*")  # not lost with the Brain
    clean = await c.replace(armed.name)
    final = await c.settle(sub)
    assert final.status == "cancelled", final
    assert not await c.store.redis.exists(sk.inbox)  # taken up ...
    assert len(c.events(clean.name, "cancel_requested")) == 1  # ... once
    assert not c.events(armed.name, "cancel_requested")
    await _all_handled(c, 5)
    assert (await c.stats())["raw_requests"] == 0  # nothing was sent


async def test_an_approval_waits_for_a_brain_killed_before_carrying_it_out(
    crash: Opener,
) -> None:
    """An approval is a decision in the session's inbox until a Brain's commit dispatches
    the run: a Brain killed after the wake, before any commit, leaves it there; the next
    Brain dispatches the run once and the mail goes once."""
    c = await crash(brains=1, hands=1, app_spec="tests.control_apps:approval_app")
    sub = await c.submit(TWO)
    sid = sub.session_id

    async def awaiting() -> list[ToolRun]:
        runs = (await c.store.load(sid)).runs.values()
        found = sorted((r for r in runs if r.status == "awaiting_approval"),
                       key=lambda r: r.run_id)
        return found if len(found) == 2 else []
    ada, grace = await eventually(awaiting, timeout=20, message="two runs await approval")
    c.stack.kill("brain-1", respawn=False)
    await c.stack.wait_exit("brain-1")
    # Decided while no Brain runs: the armed one is woken with the decision in the inbox.
    await c.client.approve(sid, ada.run_id, ada.intent.approval_digest or "")
    armed = await c.spawn_armed("brain", "brain.after_wake")
    await c.died_at(armed.name, "brain.after_wake")
    sk = c.store.keys.session(sid)
    assert await c.store.redis.hexists(sk.inbox, f"decide:{ada.run_id}")  # not lost
    clean = await c.replace(armed.name)
    await c.client.reject(sid, grace.run_id, "not this one")
    final = await c.settle(sub)
    assert final.status == "completed", final
    assert not await c.store.redis.exists(sk.inbox)  # both carried out ...
    carried = c.events(clean.name, "decisions_carried_out")
    assert sorted(r for e in carried for r in e["approved"]) == [ada.run_id]  # ... once
    assert not c.events(armed.name, "decisions_carried_out")
    stats = await c.stats()
    assert stats["deliveries"] == {"ada@example.com": 1}, stats
