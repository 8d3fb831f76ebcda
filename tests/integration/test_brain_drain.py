"""A Brain stopping while a pass waits on its model hands the session over: its drain
(``drain_timeout_s``) runs out, the pass is cancelled and its wake goes back to the stream at
once, so another Brain takes the session over from its last commit and runs the model call
again. Nothing the session committed is lost and no tool runs twice.

The wake consumer's ack wait is set far beyond the test's deadline: the session can only
finish in time if the stopping Brain returned the wake itself."""

from __future__ import annotations

import asyncio

from baton.brain.worker import BrainWorker
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.receipts import LeaseDetail
from baton.settings import Settings
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
    # The second Brain took over on the wake the first returned (not a later timer's).
    lease = next(r for r in receipts if r.kind == "lease")
    takeover = next(r for r in receipts if r.kind == "takeover")
    assert lease.worker and lease.worker.name == "brain-1"
    assert takeover.worker and takeover.worker.name == "brain-2"
    assert isinstance(lease.detail, LeaseDetail) and isinstance(takeover.detail, LeaseDetail)
    assert lease.detail.carrier and takeover.detail.carrier
    assert takeover.detail.carrier.stream_seq == lease.detail.carrier.stream_seq
    assert takeover.detail.carrier.delivery > 1
