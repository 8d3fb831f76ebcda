"""Run an existing PydanticAI agent durably on Brains and Hands.

    from pydantic_ai import Agent
    from baton.pydantic_ai import ToolOptions, durable_app, tool_context

    agent = Agent("openai:gpt-4o-mini", name="support", instructions="...")

    @agent.tool_plain
    async def lookup_order(order_id: str) -> dict: ...

    app = durable_app(agent, tools={"lookup_order": ToolOptions(replay="safe")})

Each model request is a Brain step (``baton.pydantic_ai.model``): the agent assembles the
request and calls its model, any model PydanticAI supports, and the Brain commits the
response and the tool calls it asks for. Each tool call is a tool run executed by Hands
under its attempt fence with the replay policy given here (``baton.pydantic_ai.tools``);
tools that ``requires_approval`` wait for ``baton approve``. Needs Baton's
``pydantic-ai`` extra (from a checkout: ``pip install '.[pydantic-ai]'``).
"""

try:
    import pydantic_ai  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "pydantic_ai":
        raise
    raise ModuleNotFoundError(
        "baton.pydantic_ai needs PydanticAI: install Baton's pydantic-ai extra (from a "
        "checkout: pip install '.[pydantic-ai]'), or pydantic-ai-slim with your provider's "
        "extra", name="pydantic_ai") from None

from baton.pydantic_ai.app import durable_app
from baton.pydantic_ai.model import PydanticAIModel
from baton.pydantic_ai.tools import PydanticAITool, ToolOptions, tool_context

__all__ = ["PydanticAIModel", "PydanticAITool", "ToolOptions", "durable_app", "tool_context"]
