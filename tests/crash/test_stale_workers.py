"""Stale workers (DESIGN 4.3): a Brain or a Hands frozen by SIGSTOP while it owns work, taken
over by another replica, then resumed. Its late write is refused by the fence, recorded as
a 'refused' receipt, and changes nothing.

Topologies: every test runs on one Redis server;
test_stale_brain_commit_is_refused_after_takeover also runs on a 3+6 Redis Cluster
(DevStack(cluster=True)), the file's representative case (a cluster stack takes seconds to
start; the suite's time allows one per file).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.models import ToolRun
from baton.receipts import Receipt
from tests.conftest import TOPOLOGIES
from tests.crash.conftest import RECIPIENTS, Crash, Opener
from tests.helpers import eventually

pytestmark = [pytest.mark.crash, pytest.mark.timeout(90)]


def _stopped(pid: int | None) -> bool:
    """Whether the kernel has stopped ``pid`` (true where /proc cannot tell)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return not Path("/proc/self").exists()
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


async def _pause(c: Crash, name: str) -> None:
    c.stack.pause(name)
    pid = c.stack.proc(name).pid
    await eventually(lambda: _stopped(pid), timeout=30, message=f"{name} stopped")


# ---------------------------------------------------------------------- Brain


async def _pause_brain_in_request(c: Crash, session: str) -> tuple[str, int]:
    """SIGSTOP the Brain that is inside the model call of the session's generation task.

    Returns (brain, fence). The slow model stalls for half a second; if the Brain got past
    it between the look and the signal, it is resumed and the next request phase is used.
    """
    for _ in range(5):
        brain, fence = await eventually(lambda: c.brain_in_request(session), timeout=20,
                                        message="a Brain in the model")
        await _pause(c, brain)
        if await c.brain_in_request(session) == (brain, fence):
            return brain, fence
        c.stack.resume(brain)  # too late: it already committed; try the next phase
    raise AssertionError("never caught a Brain inside the model call")


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_stale_brain_commit_is_refused_after_takeover(
    crash: Opener, topology: str
) -> None:
    c = await crash(brains=2, hands=2, relays=1, app_spec="tests.apps:slow_app",
                    env={"TEST_MODEL_DELAY_MS": "500"})
    sub = await c.submit()
    session = sub.session_id
    stale, fence = await _pause_brain_in_request(c, session)

    async def taken_over() -> Receipt | None:
        found = [r for r in await c.receipts(session, "takeover") if r.fence > fence]
        return found[0] if found else None

    takeover = await eventually(taken_over, timeout=15, message="another Brain took over")
    assert getattr(takeover.detail, "previous_holder", None) == stale
    assert takeover.worker is not None and takeover.worker.name != stale
    final = await c.settle(sub)
    await c.check_completed(final)
    await c.check_exactly_once(raw_requests=5)

    before = await c.receipts(session)
    entries = len(await c.entries(session))
    c.stack.resume(stale)

    async def refused() -> list[Receipt]:
        # Its first write after the resume is refused: the commit of the model's answer, or
        # its lease renewal if the renewer runs first (it then cancels the pass before the
        # commit). Both wake on the same overdue clock, so either may come first.
        return [r for r in await c.receipts(session, "refused")
                if r.detail.op in ("commit", "renew")]

    refusals = await eventually(refused, timeout=10, message="the stale write was refused")
    for refusal in refusals:  # both, when the renewal's cancel came during the commit
        assert refusal.worker is not None and refusal.worker.name == stale
        assert refusal.fence == fence and getattr(refusal.detail, "current", 0) > fence, refusal
    await eventually(lambda: c.events(stale, "wake_handled", session_id=session,
                                      outcome="fenced"),
                     timeout=10, message="the stale Brain stopped with 'fenced'")
    # Nothing it held was written: no commit since, the transcript and result unchanged.
    after = (await c.receipts(session))[len(before):]
    assert [r.kind for r in after if r.kind not in ("lease", "refused")] == [], after
    assert len(await c.entries(session)) == entries
    assert (await c.store.inbox.submission(session, sub.id)) == final
    await c.check_completed(final)
    await c.check_exactly_once(raw_requests=5)
    assert c.stack.proc(stale).alive, "a fenced Brain keeps serving other sessions"


# ---------------------------------------------------------------------- Hands


async def _pause_hands_mid_send(c: Crash, session: str) -> tuple[ToolRun, str]:
    """SIGSTOP a Hands whose mail the service has accepted but not yet answered."""

    async def in_flight() -> ToolRun | None:
        for run in await c.runs(session):
            if (run.status == "running" and run.worker and run.result is None
                    and await c.accepted(run.intent.operation_id)):
                return run
        return None

    for _ in range(5):
        run = await eventually(in_flight, timeout=20, message="a send in flight")
        assert run.worker is not None
        await _pause(c, run.worker)
        now = await c.store.runs.get(session, run.run_id)
        if now is not None and now.status == "running" and now.attempt == run.attempt:
            return run, run.worker
        c.stack.resume(run.worker)  # its reply came first: try another mail
    raise AssertionError("never caught a Hands mid-send")


SENDERS = {
    # A send through a blocking client: on SIGCONT the reply is read and the complete sent
    # before any heartbeat can run, so the fence in complete.lua is what refuses it.
    "blocking": "tests.apps:blocking_app",
    # The shipped async send: on SIGCONT the overdue attempt heartbeat and the buffered reply
    # race; either the heartbeat finds the attempt taken over (the tool is cancelled, no
    # complete is tried) or the complete is refused. Both must leave the run untouched.
    "async": "baton.examples.notices:app",
}


@pytest.mark.parametrize("sender", list(SENDERS))
async def test_stale_hands_complete_is_refused_after_takeover(crash: Opener, sender: str) -> None:
    # The mail service holds each reply 400 ms (under ATTEMPT_TTL_MS); one send per Hands.
    c = await crash(brains=1, hands=2, relays=1, app_spec=SENDERS[sender],
                    mail_delay_ms=400, env={"BATON_HANDS_CONCURRENCY": "1"})
    sub = await c.submit()
    session = sub.session_id
    run, stale = await _pause_hands_mid_send(c, session)
    to = str(run.intent.arguments["to"])

    async def taken_over() -> ToolRun | None:
        now = await c.store.runs.get(session, run.run_id)
        return now if now and now.result and now.worker != stale else None

    done = await eventually(taken_over, timeout=15, message="another Hands completed the run")
    assert done.result is not None and done.result.recovery == "confirmed", done.result
    assert done.attempt > run.attempt
    final = await c.settle(sub)
    await c.check_completed(final, {to: "confirmed after recovery"})
    await c.check_exactly_once(raw_requests=5)

    c.stack.resume(stale)

    def ended() -> list[dict[str, object]]:
        return c.events(stale, "tool_message_handled", run_id=run.run_id)

    (handled,) = await eventually(ended, timeout=10, message="the stale Hands gave up the run")
    refusals = [r for r in await c.receipts(session, "refused")
                if r.detail.op == "complete" and r.detail.run_id == run.run_id]
    if sender == "blocking" or handled["outcome"] == "complete_refused":
        assert handled["outcome"] == "complete_refused", handled
        (refusal,) = refusals
        assert refusal.worker is not None and refusal.worker.name == stale
        assert refusal.fence == run.attempt, refusal
        # complete.lua reports the attempt that took over, as "completed" before the Brain
        # applied the result and "applied" after.
        assert (refusal.detail.status, refusal.detail.current) in (
            ("applied", done.attempt), ("completed", done.attempt)), refusal
    else:
        assert handled["outcome"] == "taken_over" and not refusals, (handled, refusals)
    completes = [r for r in await c.receipts(session, "complete")
                 if getattr(r.detail, "run_id", None) == run.run_id]
    assert [r.worker.name for r in completes if r.worker] == [done.worker], completes
    # The run keeps the result of the attempt that took over; one mail per recipient.
    now = await c.store.runs.get(session, run.run_id)
    assert now is not None and (now.result, now.worker, now.attempt) == \
        (done.result, done.worker, done.attempt), now
    stats = await c.check_exactly_once(raw_requests=5)
    assert stats["deliveries"][to] == 1 and to in RECIPIENTS
    assert c.stack.proc(stale).alive
