"""The app ``baton chaos`` runs: the notices agent, and the same agent with an unsafe tool.

* ``notices`` sends with ``send_email`` (replay ``confirm``): after a kill, recovery asks the
  mail service about the operation id and never sends raw a second time.
* ``notices_unsafe`` sends with ``send_email_unsafe``, a deliberately *non-idempotent* tool
  (replay ``unsafe``): each execution posts under a fresh key, so a second execution would be
  a second delivery. A run whose attempt was cut must end ``interrupted``, never sent twice.

Both agents use the scripted model; the unsafe agent's model is the same script with the tool
renamed, so both produce one call per address and a summary naming each recipient's fate.
"""

from __future__ import annotations

import uuid
from typing import Any

from baton import Agent, App, ModelRequest, ModelResponse, ToolContext, ToolError, tool
from baton.brain.scripted import ScriptedModel
from baton.hands.tools import http_get, send_email
from baton.hands.tools.email import EmailArgs

__all__ = ["UNSAFE_AGENT", "UNSAFE_TOOL", "app"]

UNSAFE_AGENT = "notices_unsafe"
UNSAFE_TOOL = "send_email_unsafe"
_UNSAFE_MODEL = "scripted-unsafe"


@tool(name=UNSAFE_TOOL, replay="unsafe", timeout=30.0)
async def send_email_unsafe(args: EmailArgs, ctx: ToolContext) -> dict[str, Any]:
    """Send one e-mail with no idempotency: every execution is a new delivery."""
    # The key carries the operation id (to trace a delivery back to its run) plus a fresh
    # suffix, so the mail service cannot recognise a repeat: like a provider without keys.
    response = await ctx.http.post(
        f"{ctx.settings.mail_url}/send",
        json=args.model_dump(),
        headers={"Idempotency-Key": f"{ctx.operation_id}.{uuid.uuid4().hex[:12]}"},
    )
    if response.status_code != 200:
        raise ToolError(f"mail service answered {response.status_code}", code="mail_rejected")
    op = response.json()
    return {"to": op.get("to"), "message_id": op.get("message_id")}


class RenamedToolModel:
    """The scripted model, calling ``tool`` where the script says ``send_email``."""

    def __init__(self, tool_name: str) -> None:
        self.tool_name = tool_name
        self.inner = ScriptedModel()

    async def generate(self, request: ModelRequest) -> ModelResponse:
        tools = tuple({**t, "name": "send_email"} if t.get("name") == self.tool_name else t
                      for t in request.tools)
        response = await self.inner.generate(request.model_copy(update={"tools": tools}))
        calls = tuple(c.model_copy(update={"name": self.tool_name})
                      if c.name == "send_email" else c for c in response.tool_calls)
        return response.model_copy(update={"tool_calls": calls})


_INSTRUCTIONS = ("You send an approved notice to each customer named in the request, one "
                 "e-mail per recipient, then summarise the outcome for each recipient.")

app = App(
    agents=[
        Agent(name="notices", compat=1, instructions=_INSTRUCTIONS, model="scripted",
              tools=("send_email",)),
        Agent(name=UNSAFE_AGENT, compat=1, instructions=_INSTRUCTIONS, model=_UNSAFE_MODEL,
              tools=(UNSAFE_TOOL,)),
    ],
    tools=[send_email, send_email_unsafe, http_get],
    models={_UNSAFE_MODEL: RenamedToolModel(UNSAFE_TOOL)},
)
