"""A deterministic model for offline runs, tests and benchmarks.

For the notices workload it answers the way a good model would: one ``send_email`` per
address in the user's message, all in one response (parallel tool calls); once the results
are in, a summary naming each recipient's outcome.
"""

from __future__ import annotations

import json
import re

from baton.brain.model import ModelRequest, ModelResponse
from baton.models import Entry, ToolCall, Usage

EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")


def _turn(entries: tuple[Entry, ...]) -> tuple[Entry | None, list[Entry]]:
    """The last user entry and everything after it."""
    for i in range(len(entries) - 1, -1, -1):
        if entries[i].kind == "user":
            return entries[i], list(entries[i + 1 :])
    return None, []


def _fate(entry: Entry) -> str:
    """A recipient's outcome from a tool-result entry (its text is the result's JSON)."""
    try:
        result = json.loads(entry.text)
    except ValueError:
        return "failed"
    outcome, recovery = result.get("outcome"), result.get("recovery")
    if outcome == "ok":
        return "confirmed after recovery" if recovery == "confirmed" else "sent"
    if outcome == "interrupted":
        return "interrupted"
    return f"failed ({result.get('error_code') or outcome})"


class ScriptedModel:
    async def generate(self, request: ModelRequest) -> ModelResponse:
        user, after = _turn(request.entries)
        usage = Usage(input_tokens=sum(len(e.text) for e in request.entries) // 4)
        if user is None:
            return ModelResponse(text="There is nothing to do.", usage=usage)
        tool_names = {t["name"] for t in request.tools}
        called = [e for e in after if e.kind == "model" and e.tool_calls]
        if not called and "send_email" in tool_names:
            recipients = list(dict.fromkeys(EMAIL.findall(user.text)))
            if recipients:
                calls = tuple(
                    ToolCall(
                        id=f"call_{i}",
                        name="send_email",
                        arguments={"to": to, "subject": "Notice", "body": user.text[:2000]},
                    )
                    for i, to in enumerate(recipients)
                )
                return ModelResponse(tool_calls=calls, usage=usage, stop_reason="tool_use")
            return ModelResponse(text="I found no e-mail addresses to notify.", usage=usage)
        results = [e for e in after if e.kind == "tool_result"]
        if not results:
            return ModelResponse(text="Done.", usage=usage)
        lines = [f"{_recipient(e, after)}: {_fate(e)}" for e in results]
        return ModelResponse(
            text=f"Summary of {len(results)} notices: " + "; ".join(lines) + ".",
            usage=usage,
        )


def _recipient(result: Entry, after: list[Entry]) -> str:
    for e in after:
        for call in e.tool_calls:
            if call.id == result.tool_call_id:
                return str(call.arguments.get("to", "?"))
    return "?"
