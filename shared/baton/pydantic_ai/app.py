"""``durable_app``: an existing PydanticAI agent as a Baton :class:`~baton.app.App`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models import Model

from baton.app import Agent, App, Tool
from baton.errors import ConfigError
from baton.pydantic_ai.model import PydanticAIModel
from baton.pydantic_ai.tools import ToolOptions, function_tools

__all__ = ["durable_app"]


def durable_app(
    agent: PydanticAgent[Any, Any],
    *,
    name: str | None = None,
    compat: int = 1,
    tools: Mapping[str, ToolOptions] | None = None,
    deps: Callable[[], Any] | None = None,
    max_turns: int = 16,
    stream: bool = True,
    extra_tools: tuple[Tool, ...] = (),
) -> App:
    """The App whose one agent is ``agent``, run by Brains and Hands.

    ``name`` defaults to the PydanticAI agent's name. ``tools`` sets each tool's replay
    policy, timeout, approval and confirm (the default is ``unsafe``: an interrupted call is
    never repeated on its own). ``deps`` builds the agent's dependencies wherever they are
    needed: in the Brain for each model request, in Hands for each tool call. The Brain and
    Hands must load the same app (``--app module:attribute``).
    """
    agent_name = name or agent.name
    if not agent_name:
        raise ConfigError("the PydanticAI agent has no name: pass name=")
    model = agent.model
    if model is None:
        raise ConfigError(f"PydanticAI agent {agent_name} has no model")
    if not isinstance(model, Model):
        # A model named by a string is built in the Brain, where its provider's key is; a
        # tool's RunContext.model in Hands is then a stand-in (Hands never call the model).
        from pydantic_ai.models.test import TestModel

        model = TestModel()
    served = function_tools(agent.toolsets, dict(tools or {}), deps=deps, model=model)
    all_tools = [*served, *extra_tools]
    model_name = f"pydantic-ai:{agent_name}"
    baton_agent = Agent(name=agent_name, compat=compat, model=model_name,
                        tools=tuple(t.name for t in all_tools), max_turns=max_turns)
    return App(agents=[baton_agent], tools=all_tools,
               models={model_name: PydanticAIModel(agent, deps=deps, stream=stream)})
