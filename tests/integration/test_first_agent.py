"""The tutorial's first agent (baton.examples.first_agent) runs as written: the `safe` tool
looks each customer up, the `confirm` tool sends each one mail through the mail service, and
the stand-in model answers from the results."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from baton import Client, Settings
from baton.brain.worker import BrainWorker
from baton.devkit.mailbox import MailboxServer
from baton.examples.first_agent import app
from baton.hands.worker import HandsWorker
from baton.relay.worker import Relay
from tests.helpers import running


@pytest.fixture
async def mailbox() -> AsyncIterator[MailboxServer]:
    async with MailboxServer() as server:
        yield server


async def test_the_first_agent_looks_up_then_mails_each_customer_once(
    settings: Settings, mailbox: MailboxServer
) -> None:
    settings = settings.model_copy(update={"mail_url": mailbox.url})
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app)
    hands = HandsWorker(settings.model_copy(update={"worker_name": "hands-1"}), app)
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    async with running(relay, hands, brain), Client.connect(settings) as client:
        submission, _ = await client.submit("Tell C-1 and C-2 that our terms change.",
                                            agent="first")
        final = await client.wait(submission, timeout=60)
    assert final.status == "completed", final
    assert "ada@example.com" in (final.answer or "") and "grace@example.com" in final.answer
    async with httpx.AsyncClient() as http:
        stats = (await http.get(f"{mailbox.url}/stats")).json()
    assert stats["deliveries"] == {"ada@example.com": 1, "grace@example.com": 1}
