"""A first agent (the tutorial's): a ``safe`` tool that reads, a ``confirm`` tool that acts.

``lookup_customer`` only reads, so after a crash it simply runs again. ``send_email`` has an
outside effect: after a crash its ``confirm`` function asks the mail service whether the mail
went out under this run's operation id, and the run adopts that answer instead of sending
twice. A stand-in model drives the tools so that the example runs offline::

    baton dev up --detach --app baton.examples.first_agent:app --mail-delay-ms 20000
    baton submit --wait "Tell C-1 and C-2 that our terms change on 1 March."
"""

from __future__ import annotations

import json
import re

from pydantic import BaseModel, Field

from baton import Agent, App, ModelRequest, ModelResponse, ToolCall, ToolContext, tool

CUSTOMERS = {"C-1": "ada@example.com", "C-2": "grace@example.com", "C-3": "linus@example.com"}


class CustomerArgs(BaseModel):
    customer_id: str = Field(pattern=r"^C-\d+$", description="the customer, e.g. C-1")


class EmailArgs(BaseModel):
    to: str = Field(description="recipient address")
    subject: str
    body: str


@tool(replay="safe", timeout=5.0)  # reads only: running it again changes nothing
async def lookup_customer(args: CustomerArgs, ctx: ToolContext) -> dict[str, str]:
    """A customer's e-mail address."""
    return {"customer_id": args.customer_id, "email": CUSTOMERS.get(args.customer_id, "")}


@tool(replay="confirm", timeout=60.0)  # acts: after a crash, ask before sending again
async def send_email(args: EmailArgs, ctx: ToolContext) -> dict[str, str]:
    """Send one e-mail through the mail service, once per operation id."""
    response = await ctx.http.post(f"{ctx.settings.mail_url}/send", json=args.model_dump(),
                                   headers={"Idempotency-Key": ctx.operation_id})
    response.raise_for_status()
    return {"to": args.to, "status": response.json()["status"]}


@send_email.confirm
async def sent_already(operation_id: str, args: EmailArgs, ctx: ToolContext) -> dict | None:
    """The mail the service recorded under this operation id, or None (then it is sent)."""
    response = await ctx.http.get(f"{ctx.settings.mail_url}/operations/{operation_id}")
    if response.status_code == 404:
        return None
    response.raise_for_status()
    return {"to": args.to, "status": response.json()["status"]}


class StandInModel:
    """Any ``ModelClient`` will do; this one looks each customer up, writes to each, then
    answers. A real agent names a provider instead, e.g. ``model="openai:gpt-4o-mini"``."""

    async def generate(self, request: ModelRequest) -> ModelResponse:
        last = max(n for n, e in enumerate(request.entries) if e.kind == "user")
        question, since = request.entries[last], request.entries[last + 1:]
        found = [e for e in since if e.tool_name == "lookup_customer" and not e.is_error]
        sent = [e for e in since if e.tool_name == "send_email"]
        if not found:
            ids = re.findall(r"\bC-\d+\b", question.text)
            return ModelResponse(tool_calls=tuple(
                ToolCall(id=f"look_{last}_{n}", name="lookup_customer",
                         arguments={"customer_id": c}) for n, c in enumerate(ids)))
        if not sent:
            # a result entry's text is JSON: {"outcome", "recovery", "output", ...}
            emails = [(json.loads(e.text).get("output") or {}).get("email") for e in found]
            return ModelResponse(tool_calls=tuple(
                ToolCall(id=f"send_{last}_{n}", name="send_email",
                         arguments={"to": to, "subject": "Notice", "body": question.text})
                for n, to in enumerate(emails) if to))
        return ModelResponse(text="Sent: " + "; ".join(e.text for e in sent))


notices = Agent(name="first", compat=1, model="stand-in",
                instructions="Look each customer up, then e-mail them the notice.",
                tools=("lookup_customer", "send_email"))

app = App(agents=[notices], tools=[lookup_customer, send_email],
          models={"stand-in": StandInModel()})
