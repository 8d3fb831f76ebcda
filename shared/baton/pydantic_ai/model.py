"""A PydanticAI agent's model as a Baton ``ModelClient``: one model request per Brain step.

The Brain owns the loop: it rebuilds the conversation from committed entries, asks for one
model response, commits it with its tool runs, and applies their results later, possibly in
another Brain. Each step here runs the agent itself (``agent.run``) over that history, so
PydanticAI still assembles the request as it would (instructions, static and dynamic; tool
definitions with their ``prepare`` functions; output tools and output mode; model settings),
calls its model through the public ``Model`` interface, and validates a final output.
The model is wrapped (:class:`_HandOff`) so that as soon as a response asks for function
tools, the run stops there and the calls go back to the Brain, which commits them as tool
runs for Hands; PydanticAI never executes a tool inside the Brain.

A final output that is not text (an ``output_type``) becomes the answer as JSON. Text deltas
of a streamed request reach ``on_text`` (the Brain's partial commits, seen by
``baton watch``). Provider errors map onto Baton's: rate limits, overload, 5xx, connection
errors and timeouts are ``ModelRetryableError`` (the Brain's durable backoff), the rest
``ModelError``. The provider SDK's own in-process retries (openai's, anthropic's) are turned
off, so every attempt is the Brain's, recorded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.exceptions import (
    ModelAPIError,
    ModelConnectionError,
    ModelHTTPError,
    ModelRateLimitError,
    ModelRequestTimeout,
    ModelServerError,
    ModelUnavailableError,
    UnexpectedModelBehavior,
)
from pydantic_ai.messages import (
    ModelMessage,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ToolCallPart,
)
from pydantic_ai.messages import ModelResponse as PaiResponse
from pydantic_ai.models import ModelRequestParameters, StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_core import to_json

from baton.brain.model import ModelRequest, ModelResponse, TextSink
from baton.errors import ModelError, ModelRetryableError
from baton.models import ToolCall, Usage
from baton.pydantic_ai.messages import to_messages

__all__ = ["PydanticAIModel"]

PROVIDER = "pydantic-ai"


class _ToolCallsAsked(Exception):
    """The response asks for function tools: stop the run, the Brain takes it from here."""

    def __init__(self, response: PaiResponse, tools: set[str]) -> None:
        super().__init__("function tool calls handed to the Brain")
        self.response = response
        self.tools = tools


def _check(response: PaiResponse, params: ModelRequestParameters) -> PaiResponse:
    names = {t.name for t in params.function_tools}
    if any(isinstance(p, ToolCallPart) and p.tool_name in names for p in response.parts):
        raise _ToolCallsAsked(response, names)
    return response


class _HandOff(WrapperModel):
    """The agent's model, stopping the run at the first response that calls function tools."""

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> PaiResponse:
        return _check(await self.wrapped.request(messages, model_settings,
                                                 model_request_parameters),
                      model_request_parameters)

    @asynccontextmanager
    async def request_stream(self, messages: list[ModelMessage],
                             model_settings: ModelSettings | None,
                             model_request_parameters: ModelRequestParameters,
                             run_context: Any = None) -> AsyncIterator[StreamedResponse]:
        async with self.wrapped.request_stream(messages, model_settings,
                                               model_request_parameters, run_context) as stream:
            yield stream
        _check(stream.get(), model_request_parameters)


class PydanticAIModel:
    """``generate`` runs one model request of ``agent`` over the committed conversation.

    ``deps`` builds the agent's dependencies for the step (instructions functions and tool
    ``prepare`` functions may read them); ``stream`` asks the model for a streamed response
    (falls back to a plain request for a model that cannot stream).
    """

    def __init__(self, agent: PydanticAgent[Any, Any], *, deps: Callable[[], Any] | None = None,
                 stream: bool = True) -> None:
        self.agent = agent
        self.deps = deps
        self.stream = stream and _can_stream(agent.model)
        self._model: _HandOff | None = None

    def _wrapped(self) -> _HandOff:
        """The agent's model, built once (a model named by a string reads its provider's key
        from the environment here, in the Brain) and wrapped to hand tool calls over."""
        if self._model is None:
            model = self.agent.model
            if model is None:
                raise ModelError("the PydanticAI agent has no model", provider=PROVIDER)
            try:
                self._model = _HandOff(model)
            except Exception as exc:  # a missing key or an unknown provider
                raise ModelError(f"cannot build model {model!r}: {exc}",
                                 provider=PROVIDER) from exc
            _without_sdk_retries(self._model.wrapped)
        return self._model

    async def generate(self, request: ModelRequest, on_text: TextSink | None = None
                       ) -> ModelResponse:
        history = to_messages(request.entries)
        wrapped = self._wrapped()
        deps = self.deps() if self.deps is not None else None
        handler = _text_handler(on_text) if on_text is not None and self.stream else None
        try:
            try:
                result = await self.agent.run(None, message_history=history, model=wrapped,
                                              deps=deps, event_stream_handler=handler)
            except NotImplementedError:
                if handler is None:
                    raise
                self.stream = False  # this model cannot stream: ask plainly from now on
                result = await self.agent.run(None, message_history=history, model=wrapped,
                                              deps=deps)
        except _ToolCallsAsked as asked:
            return _calls(asked.response, asked.tools)
        except ModelError:
            raise
        except Exception as exc:
            raise _model_error(exc) from exc
        final = result.response
        output = result.output
        text = output if isinstance(output, str) else to_json(output).decode()
        return ModelResponse(text=text, usage=_usage(final), stop_reason="end_turn",
                             provider_request_id=final.provider_response_id or "")


def _without_sdk_retries(model: Any) -> None:
    """Turn off the provider SDK's own retries (the openai and anthropic clients retry twice
    by default, in the process, unseen): a failed attempt goes to the Brain's durable retry,
    which records it, keeps the request's idempotency key and backs off as configured. The
    client is the model's own (a client the application passed in is changed too), for
    every model within: a wrapper's, and each of a FallbackModel's."""
    seen: set[int] = set()
    stack = [model]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        stack.append(getattr(current, "wrapped", None))
        inner = getattr(current, "models", None)
        if isinstance(inner, list | tuple):
            stack.extend(inner)
        try:
            client = getattr(current, "client", None)
        except Exception:  # a model whose client cannot be built here: nothing to turn off
            continue
        retries = getattr(client, "max_retries", None)
        if client is not None and isinstance(retries, int) and retries > 0:
            client.max_retries = 0


def _can_stream(model: Any) -> bool:
    """False for a ``FunctionModel`` without a stream function (it asserts rather than raise
    ``NotImplementedError``, which the fallback in ``generate`` handles for other models)."""
    from pydantic_ai.models.function import FunctionModel

    return not (isinstance(model, FunctionModel) and model.stream_function is None)


def _calls(response: PaiResponse, tools: set[str]) -> ModelResponse:
    """The response's text and its function tool calls (an output tool called beside them is
    left out: the run goes on after the tools, and the model answers again)."""
    text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
    calls = tuple(ToolCall(id=p.tool_call_id, name=p.tool_name, arguments=p.args_as_dict())
                  for p in response.parts
                  if isinstance(p, ToolCallPart) and p.tool_name in tools)
    return ModelResponse(text=text, tool_calls=calls, usage=_usage(response),
                         stop_reason="tool_use",
                         provider_request_id=response.provider_response_id or "")


def _usage(response: PaiResponse) -> Usage:
    u = response.usage
    return Usage(input_tokens=u.input_tokens or 0, output_tokens=u.output_tokens or 0)


def _text_handler(on_text: TextSink) -> Callable[[Any, Any], Any]:
    async def handle(_ctx: Any, events: AsyncIterator[Any]) -> None:
        async for event in events:
            if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                if event.part.content:
                    on_text(event.part.content)
            elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                if event.delta.content_delta:
                    on_text(event.delta.content_delta)

    return handle


RETRYABLE = (ModelRateLimitError, ModelUnavailableError, ModelServerError, ModelConnectionError,
             ModelRequestTimeout)


def _model_error(exc: Exception) -> ModelError:
    """A PydanticAI failure as Baton's: retryable when the same request may succeed later
    (a FallbackModel's group of failures: when every model's failure is)."""
    if isinstance(exc, ExceptionGroup):
        inner = [_model_error(e) for e in exc.exceptions if isinstance(e, Exception)]
        retryable = [e for e in inner if isinstance(e, ModelRetryableError)]
        if inner and len(retryable) == len(inner):
            after = [e.retry_after_s for e in retryable if e.retry_after_s is not None]
            return ModelRetryableError(f"{type(exc).__name__}: " + "; ".join(map(str, inner)),
                                       provider=PROVIDER, retry_after_s=min(after, default=None))
        return ModelError(f"{type(exc).__name__}: {exc}", provider=PROVIDER)
    status = getattr(exc, "status_code", None)
    retry_after = getattr(exc, "retry_after", None)
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, RETRYABLE) or (isinstance(exc, ModelHTTPError)
                                      and (status == 429 or (status or 0) >= 500)):
        return ModelRetryableError(message, provider=PROVIDER, status=status,
                                   retry_after_s=retry_after)
    if isinstance(exc, ModelAPIError | UnexpectedModelBehavior):
        return ModelError(message, provider=PROVIDER, status=status)
    return ModelError(message, provider=PROVIDER)
