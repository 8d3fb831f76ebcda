"""The shipped notice-batch example end to end, in one event loop against real servers."""

from __future__ import annotations

import httpx

from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.examples.notice_batch import PLAN, SUMMARY, app
from baton.settings import Settings
from tests.helpers import running, trio

RECIPIENTS = ["ada@example.com", "grace@example.com", "linus@example.com",
              "margaret@example.com", "barbara@example.com"]


async def test_five_notices_one_child_each_one_delivery_each(settings: Settings) -> None:
    async with MailboxServer() as mailbox:
        settings = settings.model_copy(update={"mail_url": mailbox.url})
        async with running(*trio(settings, app)):
            client = await Client.connect(settings)
            try:
                sid, tid, _ = await client.start_task(
                    None, "notice-batch",
                    {"recipients": RECIPIENTS, "subject": "Notice", "body": "Approved."},
                    agent="notice-batch")
                task = await client.wait_task(sid, tid, timeout=20)
                state = await client.store.load(sid)
                done = await client.store.finished_tasks(sid)
            finally:
                await client.close()
        async with httpx.AsyncClient() as http:
            stats = (await http.get(f"{mailbox.url}/stats")).json()
    assert task.state.name == "terminal" and task.state.outcome == "completed", task.state
    assert task.result == {"total": 5, "delivered": 5, "failed": 0,
                           "outcomes": {to: "delivered" for to in RECIPIENTS}}
    assert state.documents[SUMMARY].value == task.result
    assert state.documents[PLAN].value["recipients"] == RECIPIENTS
    children = [t for t in done.values() if t.kind == "send-notice"]
    assert len(children) == 5 and all(c.parent == tid for c in children)
    assert sorted(c.result["to"] for c in children) == sorted(RECIPIENTS)
    # Each child saved its operation id before sending, and sent under it.
    assert all(c.result["operation_id"] == f"{sid}:{c.id}" for c in children)
    assert stats["deliveries"] == {to: 1 for to in RECIPIENTS}
    assert stats["raw_requests"] == 5 and stats["accepted"] == 5
