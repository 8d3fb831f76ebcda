"""The one seam to language models: ``ModelClient`` and its request/response types.

Model calls happen outside every commit. A request is rebuilt from committed entries each
time (no in-memory history is trusted); its ``request_id`` is derived from the task id, the
turn and the attempt, never random, so a provider can deduplicate a re-issued request.

An agent names its model as ``[provider:]model``:

    scripted                      the deterministic offline model (brain.scripted)
    openai:gpt-4o-mini            OpenAI Chat Completions (OPENAI_API_KEY)
    openai-compatible:<model>     any Chat Completions server at BATON_OPENAI_BASE_URL
                                  (vLLM, Ollama, LiteLLM ...; the key is optional)
    anthropic:claude-...          Anthropic Messages (ANTHROPIC_API_KEY)

A client streams when it is given ``on_text``: it calls it with each text delta as it
arrives (synchronously: the caller must not block). Clients that do not stream simply
omit the parameter.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from baton.errors import ConfigError
from baton.models import Entry, Model, ToolCall, Usage

if TYPE_CHECKING:
    from baton.settings import Settings

__all__ = [
    "INTERRUPTED_NOTE",
    "ModelClient",
    "ModelRequest",
    "ModelResponse",
    "TextSink",
    "model_client",
    "streams",
]

TextSink = Callable[[str], None]

#: What a model is told after the text of an ``interrupted`` entry (an answer cut off by a
#: crash or a failed attempt): the text is shown as it was, and nothing acted on it.
INTERRUPTED_NOTE = (
    "[The previous answer was interrupted before it finished; it is shown as it was and "
    "nothing was done with it. Please answer again in full.]"
)


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
    provider_request_id: str = ""  # the provider's id of the answer, for support requests


class ModelClient(Protocol):
    """One attempt per call: the answer, or ``ModelError`` / ``ModelRetryableError``.

    A streaming client also takes ``on_text: TextSink | None = None`` (see ``streams``).
    """

    async def generate(self, request: ModelRequest) -> ModelResponse: ...


def streams(client: Any) -> bool:
    """Whether ``client.generate`` takes ``on_text`` (apps may bring clients that do not)."""
    try:
        return "on_text" in inspect.signature(client.generate).parameters
    except (TypeError, ValueError, AttributeError):
        return False


PROVIDERS = ("openai", "openai-compatible", "anthropic")


def model_client(name: str, settings: Settings | None = None) -> ModelClient:
    """The client for an agent's model name. ``scripted`` is the offline default."""
    if name == "scripted":
        from baton.brain.scripted import ScriptedModel

        return ScriptedModel()
    provider, sep, model = name.partition(":")
    if not sep or not model or provider not in PROVIDERS:
        raise ConfigError(
            f"unknown model {name!r}; use 'scripted' or '<provider>:<model>' with provider "
            f"one of {', '.join(PROVIDERS)}"
        )
    if settings is None:
        from baton.settings import Settings

        settings = Settings.from_env()
    if provider == "anthropic":
        from baton.brain.anthropic_messages import AnthropicClient

        return AnthropicClient(model, settings)
    from baton.brain.openai_chat import OpenAIClient

    return OpenAIClient(model, settings, compatible=provider == "openai-compatible")
