"""OpenAI Chat Completions: OpenAI itself and compatible servers (vLLM, Ollama, LiteLLM ...).

Entries (in the order of brain.model.conversation) map to messages: ``user`` -> user,
``model`` -> assistant (with ``tool_calls``), ``tool_result`` -> tool (with the matching
``tool_call_id``), ``interrupted`` -> the cut-off assistant text followed by a user note
saying so (brain.model.INTERRUPTED_NOTE).
Streaming reads ``chat.completion.chunk`` events until ``data: [DONE]``, with usage from
``stream_options.include_usage``; tool-call fragments are joined by their ``index``. A stream
that ends without ``[DONE]`` is truncated (retried) unless it delivered the finish_reason and
the usage chunk. The token limit goes as ``max_completion_tokens`` to OpenAI (``openai:``,
whatever the model: OpenAI deprecates ``max_tokens`` for every chat model and its reasoning
models refuse it), as ``max_tokens`` to compatible servers (``openai-compatible:``, which
mostly know only that); ``BATON_OPENAI_MAX_TOKENS_FIELD`` overrides either.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from baton.brain.model import (
    INTERRUPTED_NOTE,
    ModelRequest,
    ModelResponse,
    TextSink,
    conversation,
)
from baton.brain.model_http import HttpModel, arguments, json_object, malformed, truncated
from baton.errors import ConfigError, ModelError, ModelRetryableError
from baton.models import Entry, ToolCall, Usage, dumps
from baton.settings import Settings

OPENAI_URL = "https://api.openai.com/v1"
STOP = {"stop": "end_turn", "tool_calls": "tool_use", "function_call": "tool_use",
        "length": "max_tokens", "content_filter": "refusal"}


def messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The conversation as Chat Completions messages (rebuilt from entries every time)."""
    out: list[dict[str, Any]] = []
    if request.instructions:
        out.append({"role": "system", "content": request.instructions})
    for e in conversation(request.entries):
        out.extend(_message(e))
    return out


def _message(e: Entry) -> list[dict[str, Any]]:
    if e.kind == "user":
        return [{"role": "user", "content": e.text}]
    if e.kind == "system":
        return [{"role": "system", "content": e.text}]
    if e.kind == "tool_result":
        return [{"role": "tool", "tool_call_id": e.tool_call_id or "", "content": e.text}]
    if e.kind == "interrupted":
        return [{"role": "assistant", "content": e.text},
                {"role": "user", "content": INTERRUPTED_NOTE}]
    msg: dict[str, Any] = {"role": "assistant", "content": e.text or None}
    if e.tool_calls:
        msg["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": dumps(c.arguments)}}
            for c in e.tool_calls
        ]
    return [msg]


def tools(request: ModelRequest) -> list[dict[str, Any]]:
    return [{"type": "function",
             "function": {"name": t["name"], "description": t.get("description", ""),
                          "parameters": t.get("parameters", {"type": "object"})}}
            for t in request.tools]


def max_tokens_field(model: str, settings: Settings, *, compatible: bool) -> str:
    """``max_completion_tokens`` for OpenAI itself, ``max_tokens`` for a compatible server
    (``model`` is kept for callers: the field no longer depends on it)."""
    if settings.openai_max_tokens_field != "auto":
        return settings.openai_max_tokens_field
    return "max_tokens" if compatible else "max_completion_tokens"


class OpenAIClient(HttpModel):
    """Chat Completions over HTTP; ``compatible`` for a self-hosted server (key optional)."""

    path = "/chat/completions"

    def __init__(self, model: str, settings: Settings, *, compatible: bool = False) -> None:
        self.provider = "openai-compatible" if compatible else "openai"
        base = settings.openai_base_url or ("" if compatible else OPENAI_URL)
        if not base:
            raise ConfigError(f"model openai-compatible:{model} needs OPENAI_BASE_URL (or "
                              "BATON_OPENAI_BASE_URL), e.g. http://localhost:8000/v1 for vLLM")
        if not compatible and not settings.openai_api_key:
            raise ConfigError(f"model openai:{model} needs OPENAI_API_KEY (or "
                              "BATON_OPENAI_API_KEY) in the environment")
        self.key = settings.openai_api_key
        self.max_tokens_field = max_tokens_field(model, settings, compatible=compatible)
        super().__init__(model, settings, base)

    def headers(self, request: ModelRequest) -> dict[str, str]:
        out = {}
        if self.key:
            out["authorization"] = f"Bearer {self.key}"
        return out

    def body(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages(request),
            self.max_tokens_field: self.settings.model_max_tokens,
        }
        if request.tools:
            body["tools"] = tools(request)
            body["parallel_tool_calls"] = True
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def answer(self, data: dict[str, Any]) -> ModelResponse:
        p = self.provider
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise malformed(p, "no choices")
        msg = choices[0].get("message")
        if not isinstance(msg, dict):
            raise malformed(p, "choice without a message")
        calls = []
        for c in msg.get("tool_calls") or ():
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not fn.get("name") or not c.get("id"):
                raise malformed(p, "a tool call without id or function name")
            calls.append(ToolCall(id=c["id"], name=fn["name"],
                                  arguments=arguments(p, fn.get("arguments"))))
        return ModelResponse(
            text=msg.get("content") or "", tool_calls=tuple(calls), usage=_usage(data),
            stop_reason=STOP.get(choices[0].get("finish_reason") or "", "end_turn"),
        )

    async def read_stream(
        self, events: AsyncIterator[tuple[str, str]], on_text: TextSink | None
    ) -> ModelResponse:
        p = self.provider
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        usage, finish, done, counted = Usage(), "", False, False
        async for _, data in events:
            if data.strip() == "[DONE]":
                done = True
                break
            chunk = json_object(p, data)
            if "error" in chunk:
                err = chunk["error"]
                message = err.get("message") if isinstance(err, dict) else str(err)
                raise ModelRetryableError(f"{p} stream failed: {message}", provider=p)
            if chunk.get("usage"):
                usage, counted = _usage(chunk), True
            for choice in chunk.get("choices") or ():
                if not isinstance(choice, dict):
                    raise malformed(p, "a choice is not an object")
                delta = choice.get("delta") or {}
                if not isinstance(delta, dict):
                    raise malformed(p, "a delta is not an object")
                if delta.get("content"):
                    text.append(delta["content"])
                    if on_text is not None:
                        on_text(delta["content"])
                for frag in delta.get("tool_calls") or ():
                    _join_call(p, calls, frag)
                finish = choice.get("finish_reason") or finish
        if not done and not (finish and counted):
            # The end is [DONE]; a server that omits it has at least sent the usage chunk
            # that include_usage asks for after the finish_reason. Without either, the
            # stream was cut (a dropped connection looks just like this).
            what = f"finish_reason {finish!r} but no usage chunk" if finish else "no finish_reason"
            raise truncated(p, f"{what} and no [DONE]", usage)
        out = []
        for i in sorted(calls):
            c = calls[i]
            if not c["id"] or not c["name"]:
                raise malformed(p, f"tool call {i} without id or name")
            out.append(ToolCall(id=c["id"], name=c["name"],
                                arguments=arguments(p, "".join(c["args"]))))
        return ModelResponse(text="".join(text), tool_calls=tuple(out), usage=usage,
                             stop_reason=STOP.get(finish, "end_turn"))


def _join_call(provider: str, calls: dict[int, dict[str, Any]], frag: Any) -> None:
    if not isinstance(frag, dict) or not isinstance(frag.get("index", 0), int):
        raise malformed(provider, "a tool call fragment without an index")
    c = calls.setdefault(frag.get("index", 0), {"id": "", "name": "", "args": []})
    fn = frag.get("function") or {}
    if frag.get("id"):
        c["id"] = frag["id"]
    if fn.get("name"):
        c["name"] = fn["name"]
    if fn.get("arguments"):
        c["args"].append(fn["arguments"])


def _usage(data: dict[str, Any]) -> Usage:
    u = data.get("usage") or {}
    try:
        return Usage(input_tokens=int(u.get("prompt_tokens") or 0),
                     output_tokens=int(u.get("completion_tokens") or 0))
    except (TypeError, ValueError, AttributeError):
        raise ModelError("malformed answer: usage is not a pair of token counts") from None
