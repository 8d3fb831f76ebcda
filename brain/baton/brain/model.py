"""The one seam to language models: ``ModelClient`` and its request/response types.

Model calls happen outside every commit. A request is rebuilt from committed entries each
time (no in-memory history is trusted). Its ids are derived, never random: ``request_id`` is
``<task id>:<turn>:<attempt>`` (one per attempt: receipts, partial text, the provider's
``X-Client-Request-Id``), ``logical_id`` is ``<task id>:<turn>``, the request across its
attempts. The HTTP clients send ``Idempotency-Key: <logical_id>:<digest of the body>``
(brain.model_http.idempotency_key): the same on every attempt that re-sends the same body, so
a provider that deduplicates can answer a re-issued request from the first one, and a new
key once the body changed (an interrupted answer was added), which is another request.

An agent names its model as ``[provider:]model``:

    scripted                      the deterministic offline model (brain.scripted)
    openai:gpt-4o-mini            OpenAI Chat Completions (OPENAI_API_KEY)
    openai-compatible:<model>     any Chat Completions server at BATON_OPENAI_BASE_URL
                                  (vLLM, Ollama, LiteLLM ...; the key is optional)
    anthropic:claude-...          Anthropic Messages (ANTHROPIC_API_KEY)

Entries are append-only, in the order they were committed: a user message submitted while a
turn's tools run lands between the model's tool calls and their results. Both provider
protocols refuse that order (a tool call must be answered right after it), so clients build
their requests from ``conversation(entries)``: each model entry is followed at once by the
results of its calls, and whatever arrived in between follows those results, the same way on
every later request of the session.

A client streams when it is given ``on_text``: it calls it with each text delta as it
arrives (synchronously: the caller must not block). Clients that do not stream simply
omit the parameter.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from baton.errors import ConfigError
from baton.models import Entry, Model, ToolCall, Usage

if TYPE_CHECKING:
    from baton.settings import Settings

__all__ = [
    "INTERRUPTED_NOTE",
    "PENDING_NOTE",
    "ModelClient",
    "ModelRequest",
    "ModelResponse",
    "TextSink",
    "conversation",
    "model_client",
    "streams",
    "visible_to",
]

TextSink = Callable[[str], None]

#: What a model is told after the text of an ``interrupted`` entry (an answer cut off by a
#: crash or a failed attempt): the text is shown as it was, and nothing acted on it.
INTERRUPTED_NOTE = (
    "[The previous answer was interrupted before it finished; it is shown as it was and "
    "nothing was done with it. Please answer again in full.]"
)


#: The result shown for a tool call that has no result entry (yet): its run still goes on, or
#: it was cancelled before it ran. Both protocols need every call answered before the
#: conversation goes on; the generation task itself only asks once its results are in.
PENDING_NOTE = (
    '{"outcome": "no_result", "error": "no result was recorded for this tool call: it is '
    'still running, or it was cancelled before it ran"}'
)


def visible_to(entries: tuple[Entry, ...] | list[Entry], task_id: str) -> tuple[Entry, ...]:
    """The entries a request of task ``task_id`` is made from: its own and those of the tasks
    begun before it, each task's entries together (in commit order) and the tasks in the
    order they began (by their first entry); an entry of no task stays with the one before it.

    A message submitted while a task runs is committed among that task's entries but answered
    by its own task once the running one has ended: the running task's requests leave it out
    (else its model would answer it too, and the message's own task find it answered), and
    the message's task sees the earlier exchange whole, then the message. A task with no entry
    of its own sees every entry, as they are.
    """
    rank: dict[str, int] = {}
    ranked: list[tuple[int, int]] = []  # (task rank, position) of each entry
    last = 0
    for i, e in enumerate(entries):
        if e.task_id is not None:
            last = rank.setdefault(e.task_id, len(rank))
        ranked.append((last, i))
    own = rank.get(task_id)
    if own is None:
        return tuple(entries)
    return tuple(entries[i] for r, i in sorted(ranked) if r <= own)


def conversation(entries: tuple[Entry, ...] | list[Entry]) -> list[Entry]:
    """The entries in the order the providers require: each model entry's tool calls answered
    right after it (results moved up, ``PENDING_NOTE`` for a call without a result), then
    whatever was committed between the calls and their results, in its own order.

    A pure view of the append-only entries (nothing is rewritten), so every request of the
    session sees the same order; applying it twice changes nothing.
    """
    results: dict[str, Entry] = {}
    for e in entries:
        if e.kind == "tool_result" and e.tool_call_id and e.tool_call_id not in results:
            results[e.tool_call_id] = e
    called = {c.id for e in entries if e.kind == "model" for c in e.tool_calls}
    out: list[Entry] = []
    placed: set[int] = set()
    for e in entries:
        if e.kind == "tool_result" and e.tool_call_id in called:
            continue  # placed right after the model entry that called it
        out.append(e)
        for call in e.tool_calls if e.kind == "model" else ():
            result = results.get(call.id)
            if result is not None and id(result) not in placed:
                placed.add(id(result))
                out.append(result)
            elif result is None:
                out.append(Entry(kind="tool_result", text=PENDING_NOTE, tool_call_id=call.id,
                                 tool_name=call.name, task_id=e.task_id))
    return out


class ModelRequest(Model):
    """One model turn, as a :class:`ModelClient` receives it.

    ``entries`` is the session's conversation so far, oldest first: every submission's
    ``user`` entry, the ``model`` entries (text and ``tool_calls``), the ``tool_result``
    entries (``tool_call_id``, ``text``, ``is_error``), and ``interrupted`` or ``system``
    notes. A session may hold several submissions: the turn answers the latest ``user``
    entry and what followed it (earlier results answer earlier questions). ``tools`` are
    the agent's tools as JSON schemas. ``request_id`` names this attempt (stable across a
    Brain's crash, a fit idempotency key for the provider); ``logical_id`` the turn across
    its attempts.
    """

    model: str
    instructions: str = ""
    entries: tuple[Entry, ...] = ()
    tools: tuple[dict[str, Any], ...] = ()
    request_id: str  # this attempt: <task id>:<turn>:<attempt>
    logical_id: str = ""  # the request across its attempts: <task id>:<turn>


class ModelResponse(Model):
    """A model turn's answer: text for the user, or ``tool_calls`` to run (each with an id
    that is unique within the session: its result comes back as a ``tool_result`` entry
    with that ``tool_call_id``); a turn without tool calls ends the generation."""

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
    generate = getattr(client, "generate", None)
    try:  # through wrappers (functools.wraps: the traced client's) to the method
        target = inspect.unwrap(generate) if generate is not None else None
    except ValueError:
        target = generate
    fn = getattr(target, "__func__", None)  # a method: the same answer for its class
    if fn is not None:
        return _takes_on_text(fn)
    return _signature_has_on_text(generate)


@functools.lru_cache(maxsize=256)
def _takes_on_text(fn: Any) -> bool:
    """Per function: reading a signature costs a fifth of a millisecond, once per turn."""
    return _signature_has_on_text(fn)


def _signature_has_on_text(fn: Any) -> bool:
    try:
        return "on_text" in inspect.signature(fn).parameters
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
