"""The five-notice example written as a PydanticAI agent, run durably by Brains and Hands.

    baton dev up --app baton.examples.pydantic_notices:app

The agent is plain PydanticAI: instructions, one function tool, a model. Here the model is a
``FunctionModel`` that answers the way the scripted model does (one ``send_email`` per
address, all in one response; then a summary naming each recipient's fate), so the example
runs offline; put any PydanticAI model in its place (``"openai:gpt-4o-mini"``,
``"anthropic:claude-sonnet-4-5"``, ...). ``durable_app`` declares ``send_email`` with replay
``confirm``: a mail whose reply was lost in a crash is confirmed with the mail service by its
operation id, never sent twice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from baton import ToolContext
from baton.brain.scripted import find_emails
from baton.hands.tools.email import EmailArgs, confirm_email
from baton.hands.tools.email import send_email as send_email_tool
from baton.pydantic_ai import ToolOptions, durable_app, tool_context


def _turn(messages: list[ModelMessage]) -> tuple[str, list[ToolReturnPart], dict[str, str]]:
    """The last user prompt, the tool results after it and each call's recipient."""
    prompt, results, recipients = "", list[ToolReturnPart](), dict[str, str]()
    for message in messages:
        for part in message.parts:
            if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                prompt, results = part.content, []
            elif isinstance(part, ToolReturnPart):
                results.append(part)
            elif isinstance(part, ToolCallPart):
                recipients[part.tool_call_id] = str(part.args_as_dict().get("to", "?"))
    return prompt, results, recipients


def _fate(content: Any) -> str:
    """A recipient's outcome from a tool result's facts."""
    if not isinstance(content, dict):
        return "failed"
    if content.get("outcome") == "ok":
        return "confirmed after recovery" if content.get("recovery") == "confirmed" else "sent"
    if content.get("outcome") == "interrupted":
        return "interrupted"
    return f"failed ({content.get('error_code') or content.get('outcome')})"


def _answer(messages: list[ModelMessage]) -> list[ToolCallPart] | str:
    prompt, results, recipients = _turn(messages)
    if results:
        lines = [f"{recipients.get(r.tool_call_id, '?')}: {_fate(r.content)}" for r in results]
        return f"Summary of {len(results)} notices: " + "; ".join(lines) + "."
    calls = [ToolCallPart("send_email", {"to": to, "subject": "Notice", "body": prompt[:2000]},
                          tool_call_id=f"call_{i}") for i, to in enumerate(find_emails(prompt))]
    return calls or "I found no e-mail addresses to notify."


def notices_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    answer = _answer(messages)
    return ModelResponse(parts=[TextPart(answer)] if isinstance(answer, str) else list(answer))


async def notices_stream(messages: list[ModelMessage], info: AgentInfo
                         ) -> AsyncIterator[str | DeltaToolCalls]:
    answer = _answer(messages)
    if isinstance(answer, str):
        for i in range(0, len(answer), 16):  # streamed in pieces: `baton watch` shows them
            yield answer[i:i + 16]
        return
    for i, call in enumerate(answer):
        yield {i: DeltaToolCall(name=call.tool_name, json_args=call.args_as_json_str(),
                                tool_call_id=call.tool_call_id)}


agent = Agent(
    FunctionModel(notices_model, stream_function=notices_stream),
    name="notices",
    instructions=("You send an approved notice to each customer named in the request, one "
                  "e-mail per recipient, then summarise the outcome for each recipient."),
)


@agent.tool_plain
async def send_email(to: str, subject: str, body: str) -> dict[str, Any]:
    """Send one e-mail to one recipient through the mail service."""
    # The operation id (derived from the run id) is the mail service's Idempotency-Key.
    result: dict[str, Any] = await send_email_tool.fn(
        EmailArgs(to=to, subject=subject, body=body), tool_context())
    return result


async def confirm_send(operation_id: str, arguments: dict[str, Any], ctx: ToolContext) -> Any:
    """What the mail service recorded under the operation id, or None."""
    return await confirm_email(operation_id, EmailArgs.model_validate(arguments), ctx)


app = durable_app(agent, tools={
    "send_email": ToolOptions(replay="confirm", timeout=30.0, confirm=confirm_send),
})
