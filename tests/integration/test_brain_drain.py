"""A Brain stopping while a pass waits on its model hands the session over: its drain
(``drain_timeout_s``) runs out, the pass is cancelled, releases its lease with a handover
mark (release.lua) and its wake goes back to the stream at once, so another Brain leases the
session at once from its last commit and runs the model call again. Nothing the session
committed is lost, no tool runs twice, and the handover is not counted as a crash against
the restart limit; a Brain that dies without one still is.

The wake consumer's ack wait is set far beyond the test's deadline: the session can only
finish in time if the stopping Brain returned the wake itself."""

from __future__ import annotations

import asyncio

import pytest

from baton.brain.worker import BrainWorker
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.models import Submission
from baton.receipts import CommitDetail, LeaseDetail, Receipt
from baton.settings import Settings
from baton.store.store import Store
from tests.helpers import eventually, running, trio
from tests.integration.model_runs import FIVE, kinds, mail_stats, model_settings
from tests.model_apps import openai_app
from tests.model_server import ModelServer


async def test_a_stopping_brain_hands_its_session_over_with_nothing_lost(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer,
) -> None:
    s = model_settings(settings, model_server, mail_url=mailbox.url, drain_timeout_s=0.1,
                       ack_wait_s=300.0)
    relay, hands, first = trio(s, openai_app)
    second = BrainWorker(s.model_copy(update={"worker_name": "brain-2"}), openai_app)
    model_server.hold()  # the first model call waits until the Brain making it stops
    async with running(relay, hands):
        serving = asyncio.create_task(first.serve())
        client = await Client.connect(s)
        try:
            await asyncio.wait_for(first.ready.wait(), 60)
            sub, _ = await client.submit(FIVE, agent="notices")
            await eventually(lambda: model_server.waiting == 1, message="the model call")
            first.shutdown()
            await serving  # the drain ran out: the pass was cancelled mid-call
            model_server.release()
            async with running(second):
                final = await client.wait(sub, timeout=60)
            entries = await client.store.entries(sub.session_id)
            receipts = await client.store.receipts(sub.session_id)
        finally:
            await client.close()
    assert final.status == "completed", final
    assert final.answer and final.answer.count(": sent") == 5, final.answer
    assert kinds(entries) == ["user", "model", *["tool_result"] * 5, "model"]
    stats = await mail_stats(mailbox)
    assert stats["accepted"] == 5 and stats["raw_requests"] == 5  # each notice sent once
    # The call the first Brain abandoned, made again by the second, then the summary.
    turns = [r.request_id.removeprefix(f"{final.task_id}:") for r in model_server.requests]
    assert [t.split(":")[0] for t in turns] == ["1", "1", "2"], turns
    steps = [(r.worker.name, getattr(r.detail, "step", "")) for r in receipts
             if r.kind == "commit" and r.worker]
    # The first Brain's commit before its call stands; the second re-enters from it.
    assert steps == [("brain-1", "requests"), ("brain-2", "reenter"), ("brain-2", "tools"),
                     ("brain-2", "apply"), ("brain-2", "final")], steps
    # The second Brain leased it on the wake the first returned (not a later timer's), at
    # once: the first released the lease as it stopped, so no takeover waited for it to lapse.
    first_lease, second_lease = (_first_lease(receipts, f"brain-{n}") for n in (1, 2))
    assert second_lease.kind == "lease"
    assert isinstance(first_lease.detail, LeaseDetail)
    assert isinstance(second_lease.detail, LeaseDetail)
    assert second_lease.detail.previous_holder == ""
    assert first_lease.detail.carrier and second_lease.detail.carrier
    assert second_lease.detail.carrier.stream_seq == first_lease.detail.carrier.stream_seq
    assert second_lease.detail.carrier.delivery > 1


def _first_lease(receipts: list[Receipt], brain: str) -> Receipt:
    """The first lease (or takeover) receipt of ``brain``."""
    return next(r for r in receipts if r.kind in ("lease", "takeover")
                and r.worker and r.worker.name == brain)


async def _stop_mid_call(brain: BrainWorker, model_server: ModelServer, held: int,
                         client: Client | None = None) -> Submission | None:
    """Serve ``brain`` (submitting the five notices through ``client`` once it is ready, if
    given) until its model call is the ``held``-th waiting at the model server, then stop
    it: its drain runs out and the pass is cancelled mid-call. The submission, if made."""
    serving = asyncio.create_task(brain.serve())
    sub = None
    try:
        await asyncio.wait_for(brain.ready.wait(), 60)
        if client is not None:
            sub, _ = await client.submit(FIVE, agent="notices")
        await eventually(lambda: model_server.waiting == held,
                         message=f"the model call of {brain.name}")
    finally:
        brain.shutdown()
        await serving
    return sub


def _reentries(receipts: list[Receipt]) -> list[tuple[str, int]]:
    """(Brain, crashes counted) of each re-entry of the interrupted request phase."""
    return [(r.worker.name, r.detail.crashes) for r in receipts
            if isinstance(r.detail, CommitDetail) and r.detail.step == "reenter" and r.worker]


async def test_brains_stopped_again_and_again_mid_call_count_no_crash(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer,
) -> None:
    """A rolling restart stopping Brain after Brain during one long model call: with a
    restart limit of 1, a single stop counted as a crash would fail the task. Three Brains
    are stopped in turn while their call waits; the fourth completes the session, and each
    re-entry counted no crash. (Before handovers were marked, the second Brain failed the
    task: "restart limit: a worker died 1 times in phase request".)"""
    s = model_settings(settings, model_server, mail_url=mailbox.url, drain_timeout_s=0.1,
                       ack_wait_s=300.0, restart_limit=1)
    relay, hands, _ = trio(s, openai_app)
    brains = [BrainWorker(s.model_copy(update={"worker_name": f"brain-{n}"}), openai_app)
              for n in range(1, 5)]
    model_server.hold()  # every model call waits until the Brain making it stops
    async with running(relay, hands):
        client = await Client.connect(s)
        try:
            sub = await _stop_mid_call(brains[0], model_server, 1, client)
            assert sub is not None
            for held, brain in enumerate(brains[1:3], 2):
                await _stop_mid_call(brain, model_server, held)
            model_server.release()
            async with running(brains[3]):
                final = await client.wait(sub, timeout=60)
            task = await client.wait_task(sub.session_id, final.task_id or "", timeout=10)
            receipts = await client.store.receipts(sub.session_id)
        finally:
            await client.close()
    assert final.status == "completed", final
    assert final.answer and final.answer.count(": sent") == 5, final.answer
    assert task.crashes == 0, task
    assert _reentries(receipts) == [("brain-2", 0), ("brain-3", 0), ("brain-4", 0)]
    # Each Brain after the first leased the session at once: the one before released it.
    assert not [r for r in receipts if r.kind == "takeover"]
    for n in range(2, 5):
        lease = _first_lease(receipts, f"brain-{n}")
        assert isinstance(lease.detail, LeaseDetail) and lease.detail.previous_holder == ""
    stats = await mail_stats(mailbox)
    assert stats["accepted"] == 5 and stats["raw_requests"] == 5
    turns = [r.request_id.removeprefix(f"{final.task_id}:") for r in model_server.requests]
    assert [t.split(":")[0] for t in turns] == ["1", "1", "1", "1", "2"], turns


async def test_a_brain_dying_after_a_handover_still_counts_as_a_crash(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first Brain stops mid-call and hands over; the second re-enters (no crash), calls
    the model and then leaves as a killed Brain does: its handover never reaches Redis, so
    its lease and its running phase stay behind unmarked. The third Brain takes over once
    the lease lapsed and counts that crash, which at a restart limit of 1 fails the task."""
    s = model_settings(settings, model_server, mail_url=mailbox.url, drain_timeout_s=0.1,
                       ack_wait_s=300.0, restart_limit=1)
    relay, hands, _ = trio(s, openai_app)
    first, second, third = (
        BrainWorker(s.model_copy(update={"worker_name": f"brain-{n}"}), openai_app)
        for n in range(1, 4))
    unanswered = asyncio.Event()

    async def lost(self: Store, session_id: str, fence: int) -> None:
        await unanswered.wait()  # Redis never answers: the pass gives up waiting

    model_server.hold()
    async with running(relay, hands):
        client = await Client.connect(s)
        try:
            sub = await _stop_mid_call(first, model_server, 1, client)
            assert sub is not None
            with monkeypatch.context() as patched:
                patched.setattr(Store, "hand_over", lost)
                await _stop_mid_call(second, model_server, 2)
            unanswered.set()
            model_server.release()
            async with running(third):
                final = await client.wait(sub, timeout=60)
            task = await client.wait_task(sub.session_id, final.task_id or "", timeout=10)
            receipts = await client.store.receipts(sub.session_id)
        finally:
            await client.close()
    assert task.state.name == "terminal" and task.crashes == 1, task
    assert task.state.reason == "restart limit: a worker died 1 times in phase request"
    assert final.status == "failed", final
    # brain-2's re-entry counted nothing; brain-3's counted the crash and ended the task
    assert _reentries(receipts) == [("brain-2", 0)]
    (last,) = [r for r in receipts
               if isinstance(r.detail, CommitDetail) and r.detail.step == "final"]
    assert last.worker and last.worker.name == "brain-3"
    takeovers = [r for r in receipts if r.kind == "takeover"]
    assert [t.worker.name for t in takeovers if t.worker] == ["brain-3"]
    assert isinstance(takeovers[0].detail, LeaseDetail)
    assert takeovers[0].detail.previous_holder == "brain-2"
    assert len(model_server.requests) == 2  # the two calls released; the third never made
