"""Committed entries as PydanticAI messages, rebuilt for every model request.

    user          -> ModelRequest(UserPromptPart)
    system        -> ModelRequest(SystemPromptPart)
    model         -> ModelResponse(TextPart, ToolCallPart ...)
    tool_result   -> ModelRequest(ToolReturnPart) with the result's facts (outcome, output ...)
    interrupted   -> ModelResponse(TextPart) + ModelRequest(UserPromptPart(INTERRUPTED_NOTE))

Consecutive request-side entries become one ``ModelRequest`` whose tool returns come first:
a message that arrived while the tools of the previous response ran was appended before
their results, but providers want the results right after the calls that asked for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from baton.brain.model import INTERRUPTED_NOTE
from baton.models import Entry

__all__ = ["to_messages", "tool_return_content"]


def tool_return_content(text: str) -> Any:
    """What the model is shown of a tool result: the result's facts (outcome, recovery,
    output, error code and error), as Baton's own model clients show them, so a model
    learns that a mail was confirmed after a crash rather than sent."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def to_messages(entries: Sequence[Entry]) -> list[ModelMessage]:
    out: list[ModelMessage] = []
    pending: list[ModelRequestPart] = []

    def flush() -> None:
        if pending:
            returns = [p for p in pending if isinstance(p, ToolReturnPart)]
            others = [p for p in pending if not isinstance(p, ToolReturnPart)]
            out.append(ModelRequest(parts=[*returns, *others]))
            pending.clear()

    for e in entries:
        if e.kind == "user":
            pending.append(UserPromptPart(content=e.text))
        elif e.kind == "system":
            pending.append(SystemPromptPart(content=e.text))
        elif e.kind == "tool_result":
            pending.append(ToolReturnPart(tool_name=e.tool_name or "", tool_call_id=e.tool_call_id
                                          or "", content=tool_return_content(e.text)))
        elif e.kind == "interrupted":
            flush()
            out.append(ModelResponse(parts=[TextPart(content=e.text)]))
            pending.append(UserPromptPart(content=INTERRUPTED_NOTE))
        else:  # a model response
            flush()
            parts: list[Any] = [TextPart(content=e.text)] if e.text else []
            parts += [ToolCallPart(tool_name=c.name, args=dict(c.arguments), tool_call_id=c.id)
                      for c in e.tool_calls]
            out.append(ModelResponse(parts=parts))
    flush()
    return out
