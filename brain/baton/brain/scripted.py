"""A deterministic model for offline runs, tests and benchmarks.

For the notices workload it answers the way a good model would: one ``send_email`` per
address in the user's message, all in one response (parallel tool calls); once the results
are in, a summary naming each recipient's outcome.
"""

from __future__ import annotations

import re

import orjson

from baton.brain.model import ModelRequest, ModelResponse
from baton.models import Entry, ToolCall, Usage

# Addresses in linear time, whatever the text. The plain pattern
# ``[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}`` rescanned a run of address characters once
# per start position inside it (20 KB took 2.3 s). Here a search may only start where a local
# part starts (the look-behind fails at once inside a run), the domain is a look-ahead (a failed
# domain may still hold the next address's local part), and both parts are bounded by RFC
# 5321's lengths (64 and 255). Found addresses are the plain pattern's, up to those bounds.
_LOCAL_AT = r"([A-Za-z0-9._%+-]{1,64})@(?=([A-Za-z0-9.-]{1,255}))"
EMAIL = re.compile(r"(?<![A-Za-z0-9._%+-])" + _LOCAL_AT)
# Right after an address the next may start at once, as it does for the plain pattern.
_ADJACENT = re.compile(_LOCAL_AT)


def find_emails(text: str) -> list[str]:
    """The distinct e-mail addresses in ``text``, in order of first appearance."""
    found: dict[str, None] = {}
    pos, after_address = 0, False
    while True:
        match = _ADJACENT.match(text, pos) if after_address else None
        match = match or EMAIL.search(text, pos)
        if match is None:
            return list(found)
        domain = _domain(match.group(2))
        if domain:
            found.setdefault(f"{match.group(1)}@{domain}")
        pos, after_address = match.end() + len(domain), bool(domain)


def _domain(run: str) -> str:
    """The longest prefix of ``run`` ending in a dot and a top-level label of two letters or
    more (``sub.example.org`` of ``sub.example.org-``), or "" when there is none."""
    dot = len(run)
    while (dot := run.rfind(".", 0, dot)) > 0:
        end = dot + 1
        while end < len(run) and run[end].isascii() and run[end].isalpha():
            end += 1
        if end - dot > 2:
            return run[:end]
    return ""


def _turn(entries: tuple[Entry, ...]) -> tuple[Entry | None, list[Entry]]:
    """The last user entry and everything after it."""
    for i in range(len(entries) - 1, -1, -1):
        if entries[i].kind == "user":
            return entries[i], list(entries[i + 1 :])
    return None, []


def _fate(entry: Entry) -> str:
    """A recipient's outcome from a tool-result entry (its text is the result's JSON)."""
    try:
        result = orjson.loads(entry.text)
    except ValueError:  # orjson.JSONDecodeError is one
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
            recipients = find_emails(user.text)
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
