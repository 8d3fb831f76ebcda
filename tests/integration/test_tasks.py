"""Custom tasks with Brain, Hands and Relay in one event loop against real servers: children
and waits, failFast aborts, completing parents, durable sleeps, documents, the restart limit.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from baton.api.auth import Tokens
from baton.brain.scheduler import CHAIN_PHASES
from baton.brain.worker import BrainWorker
from baton.client import Client
from baton.errors import ConflictError, NotFoundError, ValidationError
from baton.hands.worker import HandsWorker
from baton.models import Task
from baton.receipts import CommitDetail
from baton.relay.worker import Relay
from baton.settings import Settings
from tests.api_helpers import serving_api
from tests.helpers import eventually, running
from tests.task_apps import AGENT, Counter, app


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[Client]:
    settings = settings.model_copy(update={"document_baseline_every": 16})
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app)
    hands = HandsWorker(settings.model_copy(update={"worker_name": "hands-1"}), app)
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    async with running(relay, hands, brain):
        c = await Client.connect(settings)
        try:
            yield c
        finally:
            await c.close()


async def start(client: Client, kind: str, task_input: dict[str, Any]) -> tuple[str, str]:
    sid, tid, created = await client.start_task(None, kind, task_input, agent=AGENT)
    assert created
    return sid, tid


def outcome(task: Task) -> str:
    assert task.state.name == "terminal", task.state
    return task.state.outcome


async def test_children_all_settled_and_results_consumed(client: Client) -> None:
    sid, tid = await start(client, "fanout", {"leaves": [{"text": "a"}, {"text": "b"},
                                                         {"text": "c"}]})
    task = await client.wait_task(sid, tid, timeout=15)
    assert outcome(task) == "completed", task
    assert sorted(r["echo"] for r in task.result.values()) == ["a", "b", "c"]
    state = await client.store.load(sid)
    assert state.tasks == {} and state.runs == {}  # children consumed, runs applied
    done = await client.store.finished_tasks(sid)
    children = [t for t in done.values() if t.parent == tid]
    assert len(children) == 3 and all(c.owner == tid and outcome(c) == "completed"
                                      for c in children)
    # Ids are derived: the parent's result is keyed by the children it spawned.
    assert sorted(task.result) == sorted(c.id for c in children)


async def test_fail_fast_aborts_live_siblings_and_parent_completes_after_them(
    client: Client,
) -> None:
    leaves = [{"sleep_s": 60}, {"fail": True}, {"sleep_s": 60}]
    sid, tid = await start(client, "fanout", {"leaves": leaves, "policy": "failFast"})
    task = await client.wait_task(sid, tid, timeout=15)
    assert outcome(task) == "failed" and task.state.reason == "a leaf failed: asked to fail"
    done = await client.store.finished_tasks(sid)
    children = sorted((t for t in done.values() if t.parent == tid),
                      key=lambda t: t.input.get("fail", False))
    assert [outcome(c) for c in children] == ["aborted", "aborted", "failed"]
    assert all(c.cancel_requested for c in children[:2])
    # The parent's result was decided first; it stayed completing until the siblings ended.
    receipts = await client.store.receipts(sid)
    states = [r.detail.state for r in receipts
              if isinstance(r.detail, CommitDetail) and r.detail.task_id == tid and r.detail.state]
    assert states == ["completing", "terminal"], states
    timers = await client.store.redis.zrange(client.store.keys.session(sid).timers, 0, -1)
    assert not [m for m in timers if m.startswith("task|")], timers  # sleeps cancelled


async def test_parent_whose_result_is_decided_stays_completing_until_children_end(
    client: Client,
) -> None:
    # The child sleeps long enough for a poll on a loaded machine to find the parent
    # completing (a bound, not a timing); the order is checked from the results below.
    sid, tid = await start(client, "eager", {"child_sleep_s": 3.0})

    async def completing() -> bool:
        return (await client.store.inbox.task(sid, tid)).state.name == "completing"

    await eventually(completing, timeout=30, message="the parent is completing")
    task = await client.wait_task(sid, tid, timeout=30)
    assert outcome(task) == "completed"
    (child,) = [t for t in (await client.store.finished_tasks(sid)).values() if t.parent == tid]
    assert outcome(child) == "completed" and child.result["woke_ms"] >= task.result["decided_ms"]


async def test_sleep_is_a_durable_timer_fired_by_the_relay(client: Client) -> None:
    # Long enough for a poll on a loaded machine to find it asleep (a bound, not a timing).
    sid, tid = await start(client, "sleeper", {"seconds": 1.5})

    async def sleeping() -> Task | None:
        t = await client.store.inbox.task(sid, tid)
        return t if t.state.name == "sleeping" else None

    asleep = await eventually(sleeping, timeout=30, message="the task sleeps")
    member = f"task|{sid}|{tid}|"
    timers = await client.store.redis.zrange(client.store.keys.session(sid).timers, 0, -1,
                                             withscores=True)
    due = [score for m, score in timers if m.startswith(member)]
    assert due == [asleep.state.until_ms]  # type: ignore[union-attr]
    # Nothing else wakes the session within the wait below (its deadline is 15 s away).
    task = await client.wait_task(sid, tid, timeout=30)
    assert outcome(task) == "completed"
    assert task.result["woke_ms"] >= asleep.state.until_ms  # type: ignore[union-attr]
    assert task.result["woke_ms"] - task.result["slept_at"] >= 1500


async def test_documents_are_stored_as_deltas_with_periodic_baselines(client: Client) -> None:
    sid, tid = await start(client, "writer", {"times": 40})
    task = await client.wait_task(sid, tid, timeout=15)
    assert outcome(task) == "completed" and task.result == {"n": 40}
    docs = await client.store.redis.hgetall(client.store.keys.session(sid).docs)
    # Baselines at versions 1, 17, 33 (K = 16); the deltas after the newest one only.
    assert docs["counter"] == "40 33"
    assert sorted(k for k in docs if k.startswith("counter@") and k != "counter@b") == \
        sorted(f"counter@{v}" for v in range(34, 41))
    assert '"version":33' in docs["counter@b"]
    doc = (await client.store.load(sid)).documents["counter"]
    assert doc.version == 40 and doc.value == {"n": 40, "history": [36, 37, 38, 39, 40]}
    # Read through the client: as it is, as it was at a kept version, and what is missing.
    assert await client.document(sid, "counter") == doc
    then = await client.document(sid, "counter", 35)
    assert then.version == 35 and then.value == {"n": 35, "history": [31, 32, 33, 34, 35]}
    assert Counter.model_validate(then.value).n == 35
    for args, missing in (((sid, "counter", 32), f"no version 32 of document counter in "
                                                  f"session {sid} (kept: 33..40)"),
                          ((sid, "counter", 41), "no version 41"),
                          ((sid, "plan"), f"no document plan in session {sid}"),
                          (("s-none", "counter"), "no session s-none")):
        with pytest.raises(NotFoundError, match=re.escape(missing)):
            await client.document(*args)


async def test_documents_over_http_as_they_are_and_were(client: Client,
                                                       settings: Settings) -> None:
    sid, tid = await start(client, "writer", {"times": 20})
    assert outcome(await client.wait_task(sid, tid, timeout=15)) == "completed"
    read = {"Authorization": "Bearer read-token-0123456789"}
    tokens = Tokens(Tokens.parse("read:read-token-0123456789", "test"))
    async with serving_api(settings, tokens) as url, httpx.AsyncClient(base_url=url) as http:
        now = (await http.get(f"/v1/sessions/{sid}/documents/counter", headers=read)).json()
        assert now == {"name": "counter", "version": 20, "head": 20,
                       "updated_ms": now["updated_ms"],
                       "value": {"n": 20, "history": [16, 17, 18, 19, 20]},
                       "archived": False, "archived_ms": None}
        then = await http.get(f"/v1/sessions/{sid}/documents/counter?version=17", headers=read)
        assert then.json()["value"] == {"n": 17, "history": [13, 14, 15, 16, 17]}
        gone = await http.get(f"/v1/sessions/{sid}/documents/counter?version=3", headers=read)
        assert gone.status_code == 404 and "(kept: 17..20)" in gone.json()["detail"]
        none = await http.get(f"/v1/sessions/{sid}/documents/plan", headers=read)
        assert none.status_code == 404 and "no document plan" in none.json()["detail"]


async def test_typed_document_rejects_an_invalid_value(client: Client) -> None:
    sid, tid = await start(client, "writer", {"invalid": True})
    task = await client.wait_task(sid, tid, timeout=15)
    assert outcome(task) == "failed"
    assert "invalid document counter: n:" in task.state.reason, task.state
    assert "counter" not in (await client.store.load(sid)).documents


async def test_a_phase_that_raises_every_time_ends_failed_at_the_restart_limit(
    client: Client,
) -> None:
    sid, tid = await start(client, "raiser", {})
    task = await client.wait_task(sid, tid, timeout=15)
    assert outcome(task) == "failed"
    assert task.state.reason == ("restart limit: phase start failed 3 times; last: "
                                 "RuntimeError: this phase always breaks"), task.state
    assert task.crashes == 3  # as the reason says (the last failure counted too)
    receipts = await client.store.receipts(sid)
    assert [r.detail.crashes for r in receipts
            if isinstance(r.detail, CommitDetail) and r.detail.step == "phase_failed"] == [1, 2]


async def test_a_wait_on_ids_not_of_the_task_fails_it_and_a_consumed_child_is_settled(
    client: Client,
) -> None:
    """A wait on an id that is neither a child nor a run of the task would be settled at
    once; it is refused (as a phase error: the task ends failed, saying which id). A child
    whose result an earlier phase read is settled: waiting on it again goes on."""
    sid, eager = await start(client, "eager", {"child_sleep_s": 30})
    other = await eventually(lambda: _children(client, sid, eager), timeout=15,
                             message="the eager task's child, still sleeping")
    for ids in (["run-1"], other, [f"{eager}-0-0"]):
        _, tid, _ = await client.start_task(sid, "waiter", {"ids": ids}, agent=AGENT)
        task = await client.wait_task(sid, tid, timeout=15)
        assert outcome(task) == "failed", task
        assert f"Step.wait on {ids[0]!r}: not a child task or tool run of task {tid}" in (
            task.state.reason), task.state  # type: ignore[union-attr]
    sid, tid = await start(client, "waiter", {})
    task = await client.wait_task(sid, tid, timeout=15)
    assert outcome(task) == "completed" and task.result == {"read": 1}, task


async def test_a_task_that_never_waits_is_cancelled_while_it_goes_on(
    client: Client,
) -> None:
    """A task going from phase to phase (Step.goto) without end: the pass yields after a
    chain of phases and looks at the session again, so a cancel that arrives
    meanwhile is taken up (it waited for the pass to end, i.e. forever)."""
    sid, tid = await start(client, "spinner", {})

    async def spun() -> int:
        task = await client.store.inbox.task(sid, tid)
        return int(task.checkpoint.data.get("n", 0)) if task.checkpoint.data.get(
            "n", 0) > 2 * CHAIN_PHASES else 0
    await eventually(spun, timeout=15, message="the spinner went round")
    assert (await client.cancel(sid, tid)).status == "requested"
    task = await client.wait_task(sid, tid, timeout=15)
    assert outcome(task) == "cancelled", task.state


async def test_a_phase_setting_batons_own_checkpoint_keys_fails(client: Client) -> None:
    sid, tid = await start(client, "meddler", {})
    task = await client.wait_task(sid, tid, timeout=15)
    assert outcome(task) == "failed"
    assert "ctx.data keys starting with '_', which are Baton's own: rename _cancelled" in (
        task.state.reason), task.state  # type: ignore[union-attr]


async def _children(client: Client, sid: str, parent: str) -> list[str]:
    return [t.id for t in (await client.store.load(sid)).tasks.values() if t.parent == parent]


async def test_start_task_is_idempotent_by_request_id(client: Client) -> None:
    first = await client.start_task("s-idem", "sleeper", {"seconds": 0.1}, agent=AGENT,
                                    request_id="r1")
    again = await client.start_task("s-idem", "sleeper", {"seconds": 0.1}, agent=AGENT,
                                    request_id="r1")
    assert first[2] and not again[2] and first[1] == again[1]
    # The same request id for another start is a conflict, as for a submission's text.
    with pytest.raises(ConflictError, match="with a different input"):
        await client.start_task("s-idem", "sleeper", {"seconds": 9}, agent=AGENT,
                                request_id="r1")
    with pytest.raises(ConflictError, match="with another kind"):
        await client.start_task("s-idem", "other-kind", {"seconds": 0.1}, agent=AGENT,
                                request_id="r1")
    with pytest.raises(ValidationError, match="compat level"):
        await client.start_task("s-idem", "sleeper", {}, agent=AGENT, compat=0)
    # What no TaskDef or Agent can declare would wait forever: refused before anything lands.
    for kind in ("", "a|b", "generation"):
        with pytest.raises(ValidationError, match="invalid task kind"):
            await client.start_task(None, kind, {}, agent=AGENT)
    with pytest.raises(ValidationError, match="a task's input is a JSON object, not list"):
        await client.start_task(None, "sleeper", [1, 2], agent=AGENT)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="invalid agent name 'Tasks'"):
        await client.start_task(None, "sleeper", {}, agent="Tasks")
    with pytest.raises(ValidationError, match="invalid agent name 'Tasks'"):
        await client.submit("hello", agent="Tasks")
    with pytest.raises(ValidationError, match="a submission's text is a string, not list"):
        await client.submit(["hello"], agent=AGENT)  # type: ignore[arg-type]
    task = await client.wait_task("s-idem", first[1], timeout=10)
    assert outcome(task) == "completed"
    assert len([r for r in await client.store.receipts("s-idem") if r.kind == "start"]) == 1


async def test_cancelling_a_task_of_a_kind_no_brain_defines_ends_it(client: Client) -> None:
    """Blocked (no handler for its kind), it has nothing to stop: it ends cancelled at once
    instead of waiting, re-leased at each deadline, for a Brain that knows its kind."""
    sid, tid, created = await client.start_task(None, "no-such-kind", {}, agent=AGENT)
    assert created

    async def blocked() -> bool:
        return tid in (await client.store.load(sid)).meta.blocked

    await eventually(blocked, timeout=10)
    await client.cancel(sid, tid)
    await client.wait_cancelled(sid, tid, timeout=10)
    task = await client.store.inbox.task(sid, tid)
    assert outcome(task) == "cancelled" and task.state.reason == "cancelled by request"
    state = await client.store.load(sid)
    assert state.tasks == {} and state.meta.blocked == {}
    assert await client.wait_cancelled(sid, timeout=10)  # the session's work: all ended
    with pytest.raises(NotFoundError, match="no session s-none"):  # not "ended": never was
        await client.wait_cancelled("s-none", timeout=10)
    with pytest.raises(NotFoundError, match="no session s-none"):
        await client.task("s-none", tid)
    with pytest.raises(NotFoundError, match=f"no task t-none in session {sid}"):
        await client.task(sid, "t-none")


async def test_input_no_live_brain_would_take_up_is_told_or_refused(client: Client) -> None:
    """The Python client gave no sign that an agent, or a task kind, no live Brain runs
    would wait (the CLI and the API warn): it warns in the log, and require_brain refuses
    with nothing written."""
    from baton.errors import UnavailableError

    async def served() -> bool:
        return await client.waits(AGENT) == ""

    await eventually(served, timeout=10)  # the fixture's Brain has announced itself
    assert "knows task kind 'no-such-kind'" in await client.waits(AGENT, kind="no-such-kind")
    assert await client.waits(AGENT, kind="sleeper") == ""
    assert "no live Brain serves agent ghost" in await client.waits("ghost")
    with pytest.raises(UnavailableError, match=r"no live Brain serves agent ghost.*not submitted"):
        await client.submit("hello?", agent="ghost", request_id="r-ghost", require_brain=True)
    with pytest.raises(UnavailableError, match=r"knows task kind 'no-such-kind'.*not started"):
        await client.start_task(None, "no-such-kind", {}, agent=AGENT, request_id="r-kind",
                                require_brain=True)
    from baton.client.input import session_for

    for request in ("r-ghost", "r-kind"):  # nothing was written
        assert not await client.store.inbox.exists(session_for(None, request))
        assert not await client.store.redis.hlen(
            client.store.keys.session(session_for(None, request)).inbox)
    sub, created = await client.submit("hello?", agent="ghost")  # kept, with a warning
    assert created and sub.status == "accepted"
    from baton.cli.inspect import session_view

    view = await session_view(client.store, sub.session_id)  # its submission was not listed
    assert [(s["submission_id"], s["status"]) for s in view["submissions"]] == [
        (sub.id, "accepted")]
    from baton.errors import WaitTimeout

    with pytest.raises(WaitTimeout, match="no live Brain serves agent ghost at compat"):
        await client.wait(sub, timeout=0.2)  # the hint names why it waits


async def test_a_cancel_reason_is_what_the_cancelled_task_ends_with(client: Client) -> None:
    """The reason was kept in the client's receipt only: every cancelled task read
    'cancelled by request'."""
    sid, tid, _ = await client.start_task(None, "sleeper", {"seconds": 600}, agent=AGENT)

    async def sleeping() -> bool:
        return (await client.task(sid, tid)).state.name == "sleeping"

    await eventually(sleeping, timeout=10)
    await client.cancel(sid, tid, reason="changed my mind")
    await client.wait_cancelled(sid, tid, timeout=10)
    task = await client.task(sid, tid)
    assert outcome(task) == "cancelled" and task.state.reason == "changed my mind"


async def test_a_cancelled_request_no_brain_took_up_has_not_ended(client: Client) -> None:
    """Its task exists only once a Brain takes the request up: an empty tasks hash read as
    "the cancelled work has ended" (`baton cancel --wait`) while it still waited."""
    from baton.errors import WaitTimeout

    sub, _ = await client.submit("anyone there?", agent="nobody-serves-this")
    await client.cancel(sub.session_id)
    with pytest.raises(WaitTimeout, match="the cancelled work has not ended"):
        await client.wait_cancelled(sub.session_id, timeout=0.5)


async def test_a_wait_that_ends_first_says_what_it_waited_for(client: Client) -> None:
    """No Brain serves "ghost": the wait ends, the submission stays, and the error is one of
    Baton's (a TimeoutError as well) naming it and the commands to follow it."""
    from baton.errors import BatonError, WaitTimeout

    sub, _ = await client.submit("hello", agent="ghost")
    with pytest.raises(WaitTimeout) as caught:
        await client.wait(sub, timeout=0.3)
    assert isinstance(caught.value, TimeoutError) and isinstance(caught.value, BatonError)
    text = str(caught.value)
    assert f"submission {sub.id} has not settled in session {sub.session_id}" in text
    assert f"baton watch {sub.session_id}" in text and caught.value.retryable
    sid, tid, _ = await client.start_task(None, "sleeper", {}, agent="ghost")
    with pytest.raises(WaitTimeout, match=f"task {tid} has not ended in session {sid}"):
        await client.wait_task(sid, tid, timeout=0.3)
