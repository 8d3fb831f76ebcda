"""The shipped notice-batch example under crashes, with real processes (DevStack): a Brain
killed in each kind of phase, a Hands killed after delivering and before sending, and a phase
that kills every Brain that runs it. Every recipient gets exactly one delivery.

Topologies: every test runs on one Redis server;
test_hands_killed_after_delivering_the_task_confirms_instead_of_resending also runs on a 3+6
Redis Cluster (DevStack(cluster=True)), the file's representative case (a cluster stack
takes seconds to start; the suite's time allows one per file).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from baton.models import Task
from tests.conftest import TOPOLOGIES
from tests.crash.conftest import RECIPIENTS, Crash, Opener

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]

APP = "baton.examples.notice_batch:app"
ONE_AT_A_TIME = {"BATON_HANDS_CONCURRENCY": "1"}
BATCH = {"recipients": list(RECIPIENTS), "subject": "Notice", "body": "Approved.",
         "confirm_after_s": 0.3}


@dataclass(frozen=True)
class PhaseCase:
    nth: int  # the armed Brain dies at its nth phase run
    phase: str
    why: str
    blamed: int | None = 1  # tasks counting the crash (None: depends on the wakes' timing)


# Phase runs of one Brain doing the whole batch: plan (1), then per child prepare and send
# (2..11), then the five checks (12..16), then summarise (17).
PHASES = [
    PhaseCase(1, "plan", "the plan document and five children staged, nothing committed"),
    PhaseCase(2, "prepare", "the first child about to save its operation id", blamed=0),
    PhaseCase(3, "send", "the first delivery staged as a tool run, not committed"),
    PhaseCase(12, "check", "a delivery's result read, not yet applied", blamed=None),
    PhaseCase(17, "summarise", "every child settled, the summary not yet written"),
]


async def run_batch(c: Crash) -> tuple[str, str]:
    sid, tid, created = await c.client.start_task(None, "notice-batch", BATCH,
                                                  agent="notice-batch")
    assert created
    return sid, tid


async def finished(c: Crash, sid: str, tid: str) -> Task:
    try:
        return await c.client.wait_task(sid, tid, timeout=40)
    except TimeoutError:
        tasks = [(t.kind, t.state) for t in (await c.store.load(sid)).tasks.values()]
        raise AssertionError(f"batch not finished; tasks {tasks}\n{c.tails()}") from None


def summary_of(task: Task) -> dict[str, str]:
    assert task.state.name == "terminal" and task.state.outcome == "completed", task.state
    assert task.result["total"] == 5 and task.result["delivered"] == 5, task.result
    return dict(task.result["outcomes"])


@pytest.mark.parametrize("case", PHASES, ids=[f"{c.phase}@{c.nth}" for c in PHASES])
async def test_brain_killed_in_a_phase_is_replaced_and_each_notice_goes_once(
    crash: Opener, case: PhaseCase
) -> None:
    c = await crash(brains=0, hands=2, relays=1, app_spec=APP)
    armed = await c.spawn_armed("brain", f"brain.in_phase@{case.nth}")
    sid, tid = await run_batch(c)
    await c.died_at(armed.name, "brain.in_phase")
    await c.replace(armed.name)
    task = await finished(c, sid, tid)
    assert summary_of(task) == {to: "delivered" for to in RECIPIENTS}
    await c.check_exactly_once(raw_requests=5)
    # The phase the Brain died in ran again under the new lease. A task marked running
    # alone counts the crash; tasks marked together (the five children) re-run one by one
    # without blame, since only one of them can have been in its phase.
    reentered: dict[str, int] = {}
    for r in await c.receipts(sid):
        if getattr(r.detail, "step", None) == "run":
            reentered.update(getattr(r.detail, "reentered", {}))
    assert reentered and set(reentered.values()) <= {0, 1}, reentered
    if case.blamed is not None:
        assert sum(reentered.values()) == case.blamed, reentered
    assert (await c.receipts(sid, "takeover"))[0].detail.previous_holder == armed.name


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_hands_killed_after_delivering_the_task_confirms_instead_of_resending(
    crash: Opener, topology: str,
) -> None:
    c = await crash(brains=1, hands=0, relays=1, app_spec=APP)
    armed = await c.spawn_armed("hands", "hands.after_effect@3", env=ONE_AT_A_TIME)
    sid, tid = await run_batch(c)
    await c.died_at(armed.name, "hands.after_effect")
    await c.replace(armed.name, env=ONE_AT_A_TIME)
    task = await finished(c, sid, tid)
    outcomes = summary_of(task)
    assert sorted(outcomes.values()) == ["confirmed by task"] + ["delivered"] * 4, outcomes
    await c.check_exactly_once(raw_requests=5)  # the lookup found it: nothing sent again
    # The uncertain run ended interrupted (replay unsafe): the child slept, then looked up.
    runs = await c.runs(sid)
    interrupted = [r for r in runs if r.result and r.result.outcome == "interrupted"]
    lookups = [r for r in runs if r.intent.tool == "lookup_notice"]
    assert len(interrupted) == 1 and interrupted[0].intent.tool == "deliver_notice"
    assert len(lookups) == 1 and lookups[0].result and lookups[0].result.output["found"]
    assert lookups[0].intent.task_id == interrupted[0].intent.task_id


async def test_hands_killed_before_sending_the_task_finds_nothing_and_sends_again(
    crash: Opener,
) -> None:
    c = await crash(brains=1, hands=0, relays=1, app_spec=APP)
    armed = await c.spawn_armed("hands", "hands.after_claim@2", env=ONE_AT_A_TIME)
    sid, tid = await run_batch(c)
    await c.died_at(armed.name, "hands.after_claim")
    await c.replace(armed.name, env=ONE_AT_A_TIME)
    task = await finished(c, sid, tid)
    assert summary_of(task) == {to: "delivered" for to in RECIPIENTS}
    await c.check_exactly_once(raw_requests=5)  # the claimed attempt never sent
    runs = await c.runs(sid)
    lookups = [r for r in runs if r.intent.tool == "lookup_notice"]
    assert len(lookups) == 1 and lookups[0].result and not lookups[0].result.output["found"]
    sends = [r for r in runs if r.intent.task_id == lookups[0].intent.task_id
             and r.intent.tool == "deliver_notice"]
    assert [r.result.outcome for r in sends if r.result] == ["interrupted", "ok"]
    assert sends[0].intent.arguments["operation_id"] == sends[1].intent.arguments["operation_id"]


async def test_a_phase_that_kills_every_brain_ends_failed_at_the_restart_limit(
    crash: Opener,
) -> None:
    """Every Brain incarnation dies in the plan phase; the supervisor keeps restarting it.
    The third death is the restart limit (3): the next Brain fails the task instead."""
    c = await crash(brains=1, hands=1, relays=1, app_spec=APP,
                    env={"BATON_FAULT": "brain.in_phase"})
    sid, tid = await run_batch(c)
    task = await finished(c, sid, tid)
    assert task.state.name == "terminal" and task.state.outcome == "failed"
    assert task.state.reason == "restart limit: a worker died 3 times in phase plan"
    assert task.crashes == 3  # as the reason says: two re-entries committed, the third ended it
    brain = c.stack.procs("brain")[0]
    assert brain.restarts == 3 and len(c.events(brain.name, "fault_point_hit")) == 3
    assert (await c.stats())["raw_requests"] == 0
    assert not [t for t in (await c.store.finished_tasks(sid)).values() if t.parent == tid]
