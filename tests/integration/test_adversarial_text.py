"""No input makes a worker spin, and a submission at the size limit completes.

The CPU hostile text costs on each text path is a benchmark figure (``baton bench
adversarial``), never a timed test; here a submission as large as the payload limit
allows, padded with text built to hurt the address finder, runs to completion: both
recipients get their mail once, and the answer names them.
"""

from __future__ import annotations

import httpx
import pytest

from baton.bench.adversarial_bench import fit_submission, inputs
from baton.brain.worker import BrainWorker
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.errors import PayloadTooLarge
from baton.examples.notices import app
from baton.hands.worker import HandsWorker
from baton.models import Entry
from baton.relay.worker import Relay
from baton.settings import Settings
from tests.helpers import running


async def test_a_submission_at_the_size_limit_completes(settings: Settings,
                                                        mailbox: MailboxServer) -> None:
    settings = settings.model_copy(update={"mail_url": mailbox.url})
    hostile = inputs(settings.max_payload_bytes)
    padding = "".join(hostile[k][:200_000] for k in (
        "address run", "local parts + @", "one-letter labels", "only @", "json nesting",
        "whitespace"))
    head = "Send the approved notice to ada@example.com and grace@example.com. "
    text = fit_submission(head + padding * 2, settings.max_payload_bytes)
    stored = len(Entry(kind="user", text=text).to_json())  # what the limit measures
    assert stored > settings.max_payload_bytes - 16 * 1024, stored
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-big"}), app)
    hands = HandsWorker(settings.model_copy(update={"worker_name": "hands-big"}), app)
    relay = Relay(settings.model_copy(update={"worker_name": "relay-big"}))
    async with running(relay, hands, brain), await Client.connect(settings) as client:
        with pytest.raises(PayloadTooLarge):
            await client.submit(text + "x" * 20_000, agent="notices")
        sub, _ = await client.submit(text, agent="notices")
        final = await client.wait(sub, timeout=120)
    assert final.status == "completed", final
    assert final.answer and "ada@example.com: sent" in final.answer
    assert "grace@example.com: sent" in final.answer
    async with httpx.AsyncClient() as http:
        stats = (await http.get(f"{mailbox.url}/stats")).json()
    assert sorted(stats["deliveries"].values()) == [1, 1], stats
