"""The one seam to language models: ``ModelClient`` and its request/response types.

Model calls happen outside every commit. A request is rebuilt from committed entries each
time (no in-memory history is trusted); its ``request_id`` is derived from the task id and
the attempt, never random, so a provider can deduplicate a re-issued request.
"""

from __future__ import annotations

from typing import Any, Protocol

from shared.errors import ConfigError
from shared.models import Entry, Model, ToolCall, Usage


class ModelRequest(Model):
    model: str
    instructions: str = ""
    entries: tuple[Entry, ...] = ()
    tools: tuple[dict[str, Any], ...] = ()
    request_id: str


class ModelResponse(Model):
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = Usage()
    stop_reason: str = "end_turn"


class ModelClient(Protocol):
    async def generate(self, request: ModelRequest) -> ModelResponse: ...


def model_client(name: str) -> ModelClient:
    """The client for an agent's model name. ``scripted`` is the offline default."""
    if name == "scripted":
        from brain.scripted import ScriptedModel

        return ScriptedModel()
    raise ConfigError(f"unknown model {name!r}; available: scripted")
