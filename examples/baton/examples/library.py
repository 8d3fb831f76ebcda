"""Baton in your own code: one tool, one agent, one submission (the docs' library example).

Run the stack with this app, then submit from Python::

    baton dev up --detach --app baton.examples.library:app
    python -m baton.examples.library "Look up order A-17 for ada@example.com, then answer."
"""

from __future__ import annotations

import asyncio
import re
import sys

from pydantic import BaseModel, Field

from baton import (
    Agent,
    App,
    Client,
    ModelRequest,
    ModelResponse,
    Settings,
    ToolCall,
    ToolContext,
    tool,
)


class LookupArgs(BaseModel):
    order_id: str = Field(pattern=r"^[A-Z]-\d+$", description="the order, e.g. A-17")


@tool(replay="safe", timeout=5.0)  # reading has no outside effect: safe to run again
async def lookup_order(args: LookupArgs, ctx: ToolContext) -> dict[str, str]:
    """Look an order up by its id."""
    return {"order_id": args.order_id, "status": "shipped"}


class OrderModel:
    """A stand-in model (any ``ModelClient``): looks up every order id in the question, then
    answers from the results. Real agents name a provider instead, e.g. ``openai:gpt-4o-mini``."""

    async def generate(self, request: ModelRequest) -> ModelResponse:
        # A session may hold several questions: this turn answers the latest one and what
        # came after it
        last = max(n for n, e in enumerate(request.entries) if e.kind == "user")
        question, since = request.entries[last], request.entries[last + 1:]
        results = [e for e in since if e.kind == "tool_result"]
        if not results:
            ids = re.findall(r"\b[A-Z]-\d+\b", question.text)
            return ModelResponse(tool_calls=tuple(  # ids unique within the session
                ToolCall(id=f"call_{last}_{n}", name="lookup_order", arguments={"order_id": i})
                for n, i in enumerate(ids)))
        return ModelResponse(text="; ".join(r.text for r in results))


support = Agent(
    name="support",
    compat=1,
    instructions="Answer questions about orders; look each order up first.",
    model="orders",
    tools=("lookup_order",),
)

app = App(agents=[support], tools=[lookup_order], models={"orders": OrderModel()})


async def ask(text: str, settings: Settings) -> str:
    """Submit ``text`` to a new support session and wait for the answer."""
    async with Client.connect(settings) as client:
        submission, _ = await client.submit(text, agent="support")
        final = await client.wait(submission, timeout=60)
        return final.answer or final.status


if __name__ == "__main__":
    from baton import configure_logging, settings_from_env_or_stack

    configure_logging("warning")  # an application configures logging; here: warnings only
    print(asyncio.run(ask(sys.argv[1], settings_from_env_or_stack())))
