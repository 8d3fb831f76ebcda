"""Committed entries as PydanticAI messages, and PydanticAI failures as Baton's errors."""

from __future__ import annotations

import orjson
from pydantic_ai.exceptions import ModelHTTPError, UnexpectedModelBehavior
from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from baton.brain.generation import result_text
from baton.brain.model import INTERRUPTED_NOTE
from baton.errors import ModelRetryableError
from baton.models import Entry, ToolCall, ToolResult
from baton.pydantic_ai.messages import to_messages
from baton.pydantic_ai.model import _model_error

CALL = ToolCall(id="c1", name="add", arguments={"a": 1})
RESULT = result_text(ToolResult(outcome="ok", output=2))


def test_a_message_sent_while_tools_ran_comes_after_their_results() -> None:
    entries = [Entry(kind="user", text="add"),
               Entry(kind="model", text="adding", tool_calls=(CALL,)),
               Entry(kind="user", text="and hurry"),  # arrived while the tool ran
               Entry(kind="tool_result", text=RESULT, tool_call_id="c1", tool_name="add")]
    first, response, follow_up = to_messages(entries)
    assert isinstance(first, ModelRequest) and isinstance(response, ModelResponse)
    assert response.parts == [TextPart("adding"),
                              ToolCallPart("add", {"a": 1}, tool_call_id="c1")]
    assert isinstance(follow_up, ModelRequest)
    ret, prompt = follow_up.parts
    assert isinstance(ret, ToolReturnPart) and ret.tool_call_id == "c1"
    assert ret.content == orjson.loads(RESULT) and ret.content["output"] == 2
    assert isinstance(prompt, UserPromptPart) and prompt.content == "and hurry"


def test_an_interrupted_answer_is_a_cut_off_response_and_a_note() -> None:
    out = to_messages([Entry(kind="user", text="hi"), Entry(kind="interrupted", text="Hel")])
    assert [type(m) for m in out] == [ModelRequest, ModelResponse, ModelRequest]
    assert out[1].parts == [TextPart("Hel")]
    assert out[2].parts[0].content == INTERRUPTED_NOTE  # type: ignore[union-attr]


def test_provider_failures_map_to_retryable_or_terminal() -> None:
    limited = _model_error(ModelHTTPError(429, "m", body="slow down"))
    assert isinstance(limited, ModelRetryableError) and limited.status == 429
    assert isinstance(_model_error(ModelHTTPError(503, "m")), ModelRetryableError)
    refused = _model_error(ModelHTTPError(400, "m"))
    assert not refused.retryable and refused.status == 400
    assert not _model_error(UnexpectedModelBehavior("bad answer")).retryable
