"""PydanticAI agents on Brains and Hands (baton.pydantic_ai), against real servers.

Each model request is a Brain step, each tool call a Hands run: the five-notice agent
sends five mails exactly once, structured output and deps reach the right places, a
``requires_approval`` tool waits for an approval, and streamed text reaches the partial
receipts ``baton watch`` prints.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from baton.app import App
from baton.brain.worker import BrainWorker
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.examples.pydantic_notices import app as notices_app
from baton.hands.worker import HandsWorker
from baton.relay.worker import Relay
from baton.settings import Settings
from tests import pydantic_ai_apps as apps
from tests.helpers import eventually, running

FIVE = ("Send the approved notice to ada@example.com, grace@example.com, linus@example.com, "
        "margaret@example.com and barbara@example.com, then summarise.")


@pytest.fixture
async def mailbox() -> AsyncIterator[MailboxServer]:
    async with MailboxServer() as server:
        yield server


def _services(settings: Settings, app: App) -> tuple[Any, ...]:
    """A relay, a Brain and (when the app has tools) a Hands."""
    hands = [HandsWorker(settings.model_copy(update={"worker_name": "hands-1"}), app)
             ] if app.tools else []
    return (Relay(settings.model_copy(update={"worker_name": "relay-1"})), *hands,
            BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app))


async def test_the_pydantic_ai_notices_agent_sends_five_mails_once(
    settings: Settings, mailbox: MailboxServer
) -> None:
    settings = settings.model_copy(update={"mail_url": mailbox.url})
    async with running(*_services(settings, notices_app)):
        async with await Client.connect(settings) as client:
            sub, _ = await client.submit(FIVE, agent="notices")
            final = await client.wait(sub, timeout=30)
            entries = await client.store.entries(sub.session_id)
    assert final.status == "completed", final
    assert final.answer and final.answer.count(": sent") == 5, final.answer
    assert [e.kind for e in entries] == ["user", "model", *["tool_result"] * 5, "model"]
    assert {c.name for c in entries[1].tool_calls} == {"send_email"}
    async with httpx.AsyncClient() as http:
        stats = (await http.get(f"{mailbox.url}/stats")).json()
    assert stats["accepted"] == 5 and stats["raw_requests"] == 5, stats


async def test_output_type_deps_and_model_retry_of_a_tool(settings: Settings) -> None:
    apps.seen_tools.clear()
    async with running(*_services(settings, apps.quotes_app)):
        async with await Client.connect(settings) as client:
            sub, _ = await client.submit("How much is a lamp?", agent="quotes")
            final = await client.wait(sub, timeout=30)
            state = await client.store.runs.applied(sub.session_id)
    assert final.status == "completed", final
    # The output type, validated by PydanticAI, is the answer as JSON.
    assert orjson.loads(final.answer or "") == {"item": "lamp", "total": 12.0}
    runs = sorted(state.values(), key=lambda r: r.run_id)
    assert [r.intent.replay for r in runs] == ["safe", "safe"]
    ok, retry = runs
    # Executed by Hands with the deps factory's value; ModelRetry is a result the model sees.
    assert ok.result is not None and ok.result.output == 12.0 and ok.worker == "hands-1"
    assert retry.result is not None and retry.result.error_code == "retry"
    assert apps.seen_tools and all(t == ["price"] for t in apps.seen_tools)


async def test_a_tool_that_requires_approval_waits_for_baton_approve(settings: Settings) -> None:
    apps.wiped.clear()
    async with running(*_services(settings, apps.wipe_app)):
        async with await Client.connect(settings) as client:
            sub, _ = await client.submit("Wipe it.", agent="wiper")
            sid = sub.session_id

            async def awaiting() -> list[Any]:
                runs = (await client.store.load(sid)).runs.values()
                return [r for r in runs if r.status == "awaiting_approval"]

            (run,) = await eventually(awaiting, timeout=15, message="a run awaiting approval")
            assert apps.wiped == [] and run.intent.tool == "wipe"
            await client.approve(sid, run.run_id, run.intent.approval_digest or "")
            final = await client.wait(sub, timeout=30)
    assert final.status == "completed", final
    assert len(apps.wiped) == 1


async def test_streamed_text_reaches_the_partial_receipts(settings: Settings) -> None:
    apps.release.clear()
    settings = settings.model_copy(update={"model_partial_interval_ms": 10})
    async with running(*_services(settings, apps.story_app)):
        async with await Client.connect(settings) as client:
            sub, _ = await client.submit("Tell me a story.", agent="storyteller")

            async def partial() -> Any:
                return await client.store.partial(sub.session_id)

            saved = await eventually(partial, timeout=15, message="a partial commit")
            assert saved.text == "The first half, "
            apps.release.set()
            final = await client.wait(sub, timeout=30)
            kinds = [r.kind for r in await client.store.receipts(sub.session_id)]
    assert final.status == "completed" and final.answer == "The first half, and the second half."
    assert "partial" in kinds


@pytest.mark.parametrize("wire", ["openai", "anthropic", "fallback"])
async def test_a_provider_sdk_does_not_retry_behind_the_brains_back(wire: str) -> None:
    """A 5xx is one request and a ModelRetryableError: the Brain retries it durably, with
    a receipt per attempt. The provider SDKs' clients retried twice by default, in the
    process, before the Brain saw anything."""
    from pydantic_ai import Agent

    from baton.brain.model import ModelRequest
    from baton.errors import ModelRetryableError
    from baton.models import Entry
    from baton.pydantic_ai.model import PydanticAIModel
    from tests.model_server import Behaviour, ModelServer

    async with ModelServer() as server:
        if wire in ("openai", "fallback"):
            from pydantic_ai.models.fallback import FallbackModel
            from pydantic_ai.models.openai import OpenAIChatModel
            from pydantic_ai.providers.openai import OpenAIProvider
            model: Any = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(
                base_url=server.openai_url, api_key="test-key"))
            if wire == "fallback":  # its models' clients too; a group of 5xx is retryable
                model = FallbackModel(model)
        else:
            from anthropic import AsyncAnthropic  # the application's own client
            from pydantic_ai.models.anthropic import AnthropicModel
            from pydantic_ai.providers.anthropic import AnthropicProvider
            model = AnthropicModel("claude-3-5-haiku-latest", provider=AnthropicProvider(
                anthropic_client=AsyncAnthropic(base_url=server.anthropic_url,
                                                api_key="test-key")))
        server.script(Behaviour(status=500), Behaviour(status=500), Behaviour(status=500))
        client = PydanticAIModel(Agent(model), stream=False)
        request = ModelRequest(model="pydantic-ai", request_id="t:1:0",
                               entries=(Entry(kind="user", text="Hello"),))
        with pytest.raises(ModelRetryableError):
            await client.generate(request)
        assert len(server.requests) == 1, [s.behaviour for s in server.requests]
