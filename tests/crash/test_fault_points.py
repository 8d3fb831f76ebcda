"""One crash per fault point of the data flow (DESIGN 3): the process dies there, another
replica carries on, and the five notices still go out exactly once.

The armed process is the only one of its role until it dies (so it surely meets the work),
is never restarted, and a clean replica of its role under another name takes over.

Topologies: every test runs on one Redis server;
test_client_killed_after_submit_commit_still_completes also runs on a 3+6 Redis Cluster
(DevStack(cluster=True)), the file's representative case (a cluster stack takes seconds to
start; the suite's time allows one per file).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import dataclass

import pytest

from baton.bus.bus import Bus
from tests.conftest import TOPOLOGIES
from tests.crash.conftest import FIVE_NOTICES, Crash, Opener
from tests.helpers import eventually

pytestmark = [pytest.mark.crash, pytest.mark.timeout(90)]


@dataclass(frozen=True)
class Case:
    point: str
    role: str
    nth: int = 1
    why: str = ""
    fates: tuple[tuple[str, str], ...] = ()  # recipients whose summary line is not "sent"

    @property
    def spec(self) -> str:
        return f"{self.point}@{self.nth}"


CASES = [
    Case("brain.after_wake", "brain", 2, "tool results completed, not yet applied"),
    Case("brain.during_model", "brain", 1, "the first model call is running"),
    Case("brain.after_intent_commit", "brain", 1,
         "runs and outbox committed, the lease held for their results (the pass's last "
         "commit): the results' signal goes to the dead Brain"),
    Case("relay.after_publish", "relay", 2, "five tool messages published, rows not removed"),
    Case("hands.after_claim", "hands", 4, "mail 4 accepted as a run, nothing sent"),
    Case("hands.after_effect", "hands", 4, "mail 4 delivered, its reply never saved",
         fates=(("margaret@example.com", "confirmed after recovery"),)),
    Case("hands.after_complete", "hands", 4, "mail 4 completed, message not acked"),
]

# One send at a time per Hands: the N-th hit is the N-th mail, and the armed Hands holds
# only that one when it dies.
ONE_AT_A_TIME = {"BATON_HANDS_CONCURRENCY": "1"}


async def _run_case(c: Crash, case: Case) -> tuple[str, list[str]]:
    """Submit with the armed replica alone in its role; replace it once it died."""
    sub, armed, clean = await c.run_armed(case.role, case.spec, env=ONE_AT_A_TIME,
                                          fates=dict(case.fates))
    return sub.session_id, [armed.name, clean.name]


@pytest.mark.parametrize("case", CASES, ids=[c.point for c in CASES])
async def test_killed_at_fault_point_completes_exactly_once(crash: Opener, case: Case) -> None:
    counts = {"brains": 1, "hands": 2, "relays": 1}
    counts[{"brain": "brains", "hands": "hands", "relay": "relays"}[case.role]] = 0
    env = {}
    if case.role == "relay":
        # The N-th batch must be the five tool rows: no progress-deadline wake (a batch of
        # its own) may fire first while a loaded machine delays the Brain's first turn.
        env["BATON_PROGRESS_DEADLINE_MS"] = "120000"
    c = await crash(env=env, **counts)
    session, (armed, clean) = await _run_case(c, case)
    runs = await c.runs(session)
    fourth = runs[3]

    if case.point == "hands.after_claim":
        # Claimed, nothing sent: confirm finds nothing, so the mail is sent once, by clean.
        assert fourth.worker == clean and fourth.result is not None
        assert fourth.result.recovery == "executed_after_confirm", fourth.result
        assert await _reclaimed(c, session, fourth.run_id, armed)
    elif case.point == "hands.after_effect":
        # Sent, reply lost: confirm adopts the delivery instead of sending again.
        assert fourth.worker == clean and fourth.result is not None
        assert fourth.result.recovery == "confirmed", fourth.result
        assert await _reclaimed(c, session, fourth.run_id, armed)
    elif case.point == "hands.after_complete":
        # Completed, not acked: the redelivery finds the result and runs nothing.
        assert fourth.worker == armed and fourth.attempt == 1
        assert fourth.result is not None and fourth.result.recovery == "none"
        await eventually(lambda: c.events(clean, "tool_message_handled", run_id=fourth.run_id,
                                          outcome="duplicate"),
                         timeout=10, message="the redelivered message found the run done")
        assert not await c.receipts(session, "reclaim")
        assert (await c.stats())["raw_requests"] == 5
    elif case.role == "hands":
        raise AssertionError(case)
    else:
        assert all(r.result and r.result.recovery == "none" and r.attempt == 1 for r in runs)

    if case.role == "brain":
        # At every point the armed Brain dies holding the lease (after its intent commit,
        # held for the results: brain.held), and the wake it held unacknowledged brings the
        # clean Brain, which takes over once the lease lapsed.
        takeovers = await c.receipts(session, "takeover")
        assert takeovers and takeovers[0].detail.previous_holder == armed, takeovers
        refused = await c.receipts(session, "refused")
        assert not refused, refused
    if case.point == "relay.after_publish":
        (fault,) = c.events(armed, "fault_point_hit")
        assert fault["rows"] == 5, fault  # the batch it died holding: the five dispatches
        await _check_relay_dedupe(c, clean)


async def _reclaimed(c: Crash, session: str, run_id: str, previous: str) -> bool:
    found = [r for r in await c.receipts(session, "reclaim") if r.detail.run_id == run_id]
    assert len(found) == 1, found
    assert found[0].detail.previous_worker == previous, found[0]
    return True


async def _check_relay_dedupe(c: Crash, clean: str) -> None:
    """The clean relay re-published the dead relay's rows; JetStream stored them once."""
    await _outbox_drained(c)  # the dead relay's rows are claimed after RELAY_CLAIM_IDLE_MS
    assert c.events(clean, "outbox_rows_claimed"), "the clean relay claimed no rows"
    settings = c.stack.settings()
    bus = await Bus.connect(settings, "crash-test")
    try:
        info = await bus.nc.jetstream().stream_info(bus.names.tool_stream)
        # Five dispatches, plus any the Brain sent again itself when the relay's takeover took
        # longer than the progress deadline (a loaded machine): those rows have new ids.
        # Re-published rows of the dead relay are never stored twice (checked below too).
        redispatched = sum(len(c.events(p.name, "tool_redispatched"))
                           for p in c.stack.procs("brain"))
        stored = info.state.last_seq
        assert 5 <= stored <= 5 + redispatched, \
            f"{stored} tool messages stored, 5 dispatched, {redispatched} sent again"
    finally:
        await bus.close()
    # The relay's counters, logged when it stops: the re-published rows were duplicates.
    c.stack.kill(clean, signal.SIGTERM, respawn=False)
    await c.stack.wait_exit(clean)
    (stopped,) = c.events(clean, "relay_stopped")
    assert stopped["duplicates"] >= 5 and stopped["claimed"] >= 5, stopped


async def _outbox_drained(c: Crash) -> None:
    keys = c.store.keys

    async def empty() -> bool:
        lengths = [await c.store.redis.xlen(keys.outbox(s)) for s in range(keys.shards)]
        return sum(lengths) == 0

    await eventually(empty, timeout=10, message="every outbox row published and removed")


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_client_killed_after_submit_commit_still_completes(
    crash: Opener, topology: str
) -> None:
    """``baton submit`` dies right after its commit, before answering: the input is kept,
    the session completes, and retrying the same request id returns the same submission."""
    c = await crash(brains=1, hands=2, relays=1)
    session, request = "s-client-killed", "req-1"
    env = {**os.environ, **c.stack.env, **c.stack.settings().to_env(),
           "BATON_FAULT": "submit.after_commit"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "baton", "submit", "--session", session,
        "--request-id", request, FIVE_NOTICES, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, out, err)
    assert b"fault_point_hit" in err and b"submit.after_commit" in err, err
    assert out == b"", "the client answered before it died"

    sub = await c.store.inbox.submission_for_request(session, request)
    assert sub is not None, "the committed submission was lost"
    again, created = await c.client.submit(FIVE_NOTICES, agent="notices", session_id=session,
                                           request_id=request)
    assert not created and again.id == sub.id
    final = await c.settle(sub)
    await c.check_completed(final)
    await c.check_exactly_once(raw_requests=5)
    assert len(await c.receipts(session, "submit")) == 1
