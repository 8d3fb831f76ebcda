"""The library example of docs/concepts.md runs as written: a tool, an agent, a model of its own."""

from __future__ import annotations

from baton.brain.worker import BrainWorker
from baton.examples.library import app, ask
from baton.hands.worker import HandsWorker
from baton.relay.worker import Relay
from baton.settings import Settings
from tests.helpers import running


async def test_the_library_example_answers_from_its_tool(settings: Settings) -> None:
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app)
    hands = HandsWorker(settings.model_copy(update={"worker_name": "hands-1"}), app)
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    async with running(relay, hands, brain):
        answer = await ask("Where are orders A-17 and B-4?", settings)
    assert '"order_id":"A-17"' in answer.replace(" ", "")
    assert '"order_id":"B-4"' in answer.replace(" ", "")
    assert answer.count("shipped") == 2

