"""PydanticAI agents for the tests: structured output, deps, approval, a gated stream."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from baton.app import App
from baton.pydantic_ai import ToolOptions, durable_app


@dataclass
class Deps:
    tax_rate: float


class Quote(BaseModel):
    item: str
    total: float


seen_tools: list[list[str]] = []


def _returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]


def quote_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    seen_tools.append([t.name for t in info.function_tools])
    returns = _returns(messages)
    if not returns:
        return ModelResponse(parts=[TextPart("Looking it up."),
                                    ToolCallPart("price", {"item": "lamp"}, tool_call_id="p1"),
                                    ToolCallPart("price", {"item": "-"}, tool_call_id="p2")])
    found = {r.tool_call_id: r.content for r in returns}
    assert isinstance(found["p2"], dict) and found["p2"]["error_code"] == "retry", found
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name,
                                             {"item": "lamp", "total": found["p1"]["output"]})])


quotes = Agent(FunctionModel(quote_model), name="quotes", deps_type=Deps, output_type=Quote,
               instructions="Quote prices with tax.")


@quotes.tool
async def price(ctx: RunContext[Deps], item: str) -> float:
    """The price of an item, tax included."""
    if item == "-":
        raise ModelRetry("name an item")
    return round(10.0 * (1 + ctx.deps.tax_rate), 2)


quotes_app = durable_app(quotes, deps=lambda: Deps(tax_rate=0.2),
                         tools={"price": ToolOptions(replay="safe", timeout=5.0)})


# An approval-gated tool (PydanticAI's requires_approval): the run waits for baton approve.
wipe_agent = Agent(TestModel(call_tools=["wipe"]), name="wiper")
wiped: list[str] = []


@wipe_agent.tool_plain(requires_approval=True)
def wipe(disk: str) -> str:
    """Wipe a disk."""
    wiped.append(disk)
    return f"wiped {disk}"


wipe_app = durable_app(wipe_agent)


# A stream that stops half way until the test lets it go on (it has seen the partial).
release = asyncio.Event()


async def gated_stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
    yield "The first half, "
    await release.wait()
    yield "and the second half."


storyteller = Agent(FunctionModel(stream_function=gated_stream), name="storyteller")
story_app = durable_app(storyteller)


def openai_notices_app() -> App:
    """The five-notice agent on PydanticAI's OpenAI model, pointed at tests.model_server
    through the environment the crash stack passes (``BATON_OPENAI_BASE_URL`` / ``_API_KEY``).
    """
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from baton.examples.pydantic_notices import confirm_send, send_email

    model = OpenAIChatModel("gpt-test", provider=OpenAIProvider(
        base_url=os.environ.get("BATON_OPENAI_BASE_URL", "http://127.0.0.1:9/v1"),
        api_key=os.environ.get("BATON_OPENAI_API_KEY", "unset")))
    agent = Agent(model, name="notices", tools=[send_email],
                  instructions="Send the approved notice to each recipient, then summarise.")
    return durable_app(agent, tools={"send_email": ToolOptions(replay="confirm",
                                                               confirm=confirm_send)})
