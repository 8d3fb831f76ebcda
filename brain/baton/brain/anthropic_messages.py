"""Anthropic Messages: tool use and streaming events.

Entries (in the order of brain.model.conversation) map to alternating turns: ``user`` -> a
user text block, ``model`` -> an assistant turn of a text block and ``tool_use`` blocks,
``tool_result`` -> ``tool_result`` blocks (with the matching ``tool_use_id``) in the next user
turn, ``interrupted`` -> the cut-off text as an assistant turn and a user note saying so (a
conversation never ends on it, which the API would take as a prefill to continue). Consecutive
blocks of one role share one turn.
Streaming reads ``message_start`` ... ``message_stop``; an ``error`` event mid-stream is an
overload or server failure, hence retryable.
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
from baton.models import Entry, ToolCall, Usage
from baton.settings import Settings

ANTHROPIC_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
RETRYABLE_ERRORS = {"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}


def messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The conversation as Messages turns (rebuilt from entries every time)."""
    out: list[dict[str, Any]] = []
    for e in conversation(request.entries):
        for role, block in _blocks(e):
            if out and out[-1]["role"] == role:
                out[-1]["content"].append(block)
            else:
                out.append({"role": role, "content": [block]})
    return out


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _blocks(e: Entry) -> list[tuple[str, dict[str, Any]]]:
    if e.kind in ("user", "system"):
        return [("user", _text(e.text))]
    if e.kind == "tool_result":
        return [("user", {"type": "tool_result", "tool_use_id": e.tool_call_id or "",
                          "content": e.text, "is_error": e.is_error})]
    if e.kind == "interrupted":
        # An empty text block is refused by the API: a crash before any text says so.
        return [("assistant", _text(e.text or "(no text yet)")), ("user", _text(INTERRUPTED_NOTE))]
    out = [("assistant", _text(e.text))] if e.text else []
    out += [("assistant", {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments})
            for c in e.tool_calls]
    return out or [("assistant", _text("(empty answer)"))]


def tools(request: ModelRequest) -> list[dict[str, Any]]:
    return [{"name": t["name"], "description": t.get("description", ""),
             "input_schema": t.get("parameters", {"type": "object"})} for t in request.tools]


class AnthropicClient(HttpModel):
    provider = "anthropic"
    path = "/v1/messages"

    def __init__(self, model: str, settings: Settings) -> None:
        if not settings.anthropic_api_key:
            raise ConfigError(f"model anthropic:{model} needs ANTHROPIC_API_KEY (or "
                              "BATON_ANTHROPIC_API_KEY) in the environment")
        self.key = settings.anthropic_api_key
        super().__init__(model, settings, settings.anthropic_base_url or ANTHROPIC_URL)

    def headers(self, request: ModelRequest) -> dict[str, str]:
        return {"x-api-key": self.key, "anthropic-version": API_VERSION}

    def body(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.settings.model_max_tokens,
            "messages": messages(request),
        }
        if request.instructions:
            body["system"] = request.instructions
        if request.tools:
            body["tools"] = tools(request)
        if stream:
            body["stream"] = True
        return body

    def answer(self, data: dict[str, Any]) -> ModelResponse:
        p = self.provider
        if data.get("type") == "error":
            raise _stream_error(data)
        content = data.get("content")
        if not isinstance(content, list):
            raise malformed(p, "no content")
        text, calls = [], []
        for b in content:
            if not isinstance(b, dict):
                raise malformed(p, "a content block is not an object")
            if b.get("type") == "text":
                text.append(str(b.get("text", "")))
            elif b.get("type") == "tool_use":
                if not b.get("id") or not b.get("name"):
                    raise malformed(p, "a tool_use block without id or name")
                calls.append(ToolCall(id=b["id"], name=b["name"],
                                      arguments=arguments(p, b.get("input"))))
        usage = _usage(data.get("usage"), Usage())
        return ModelResponse(text="".join(text), tool_calls=tuple(calls), usage=usage,
                             stop_reason=str(data.get("stop_reason") or "end_turn"))

    async def read_stream(
        self, events: AsyncIterator[tuple[str, str]], on_text: TextSink | None
    ) -> ModelResponse:
        p = self.provider
        blocks: dict[int, dict[str, Any]] = {}
        usage, stop, ended = Usage(), "end_turn", False
        async for event, data in events:
            if event == "ping":
                continue
            ev = json_object(p, data)
            kind = ev.get("type", event)
            if kind == "error":
                raise _stream_error(ev)
            if kind == "message_start":
                usage = _usage((ev.get("message") or {}).get("usage"), usage)
            elif kind == "content_block_start":
                block = ev.get("content_block")
                if not isinstance(block, dict) or not isinstance(ev.get("index"), int):
                    raise malformed(p, "content_block_start without a block or index")
                blocks[ev["index"]] = {**block, "parts": []}
            elif kind == "content_block_delta":
                block = blocks.get(ev.get("index"))  # type: ignore[arg-type]
                delta = ev.get("delta")
                if block is None or not isinstance(delta, dict):
                    raise malformed(p, "a delta for a block that never started")
                if delta.get("type") == "text_delta":
                    block["parts"].append(delta.get("text", ""))
                    if on_text is not None and delta.get("text"):
                        on_text(delta["text"])
                elif delta.get("type") == "input_json_delta":
                    block["parts"].append(delta.get("partial_json", ""))
            elif kind == "message_delta":
                stop = (ev.get("delta") or {}).get("stop_reason") or stop
                usage = _usage(ev.get("usage"), usage)
            elif kind == "message_stop":
                ended = True
                break
        if not ended:
            raise truncated(p, "no message_stop", usage)
        text, calls = [], []
        for i in sorted(blocks):
            b = blocks[i]
            if b.get("type") == "text":
                text.append(b.get("text", "") + "".join(b["parts"]))
            elif b.get("type") == "tool_use":
                raw = "".join(b["parts"])
                if not b.get("id") or not b.get("name"):
                    raise malformed(p, "a tool_use block without id or name")
                calls.append(ToolCall(id=b["id"], name=b["name"],
                                      arguments=arguments(p, raw or b.get("input"))))
        return ModelResponse(text="".join(text), tool_calls=tuple(calls), usage=usage,
                             stop_reason=str(stop))


def _stream_error(ev: dict[str, Any]) -> ModelError:
    raw = ev.get("error")
    err: dict[str, Any] = raw if isinstance(raw, dict) else {}
    kind, message = str(err.get("type", "error")), str(err.get("message", ""))
    text = f"anthropic error {kind}: {message}"
    if kind in RETRYABLE_ERRORS:
        return ModelRetryableError(text, provider="anthropic")
    return ModelError(text, provider="anthropic")


def _usage(u: Any, before: Usage) -> Usage:
    """Usage from a usage object; fields it lacks keep their value (streams report in parts)."""
    if not isinstance(u, dict):
        return before
    try:
        return Usage(
            input_tokens=int(u.get("input_tokens", before.input_tokens) or 0),
            output_tokens=int(u.get("output_tokens", before.output_tokens) or 0),
        )
    except (TypeError, ValueError):
        raise malformed("anthropic", "usage is not a pair of token counts") from None
