"""``send_email``: delivers through the mail service, recoverable by ``confirm``.

The operation id is derived from the tool run id (never from a model's tool-call id) and
sent as the ``Idempotency-Key``; ``confirm`` asks the mail service what happened to it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from baton.app import ToolContext, tool
from baton.errors import ToolError


class EmailArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to: str = Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$", description="recipient address")
    subject: str = Field(max_length=300)
    body: str = Field(max_length=20_000)


@tool(replay="confirm", timeout=30.0)
async def send_email(args: EmailArgs, ctx: ToolContext) -> dict[str, Any]:
    """Send one e-mail to one recipient through the mail service."""
    response = await ctx.http.post(
        f"{ctx.settings.mail_url}/send",
        json=args.model_dump(),
        headers={"Idempotency-Key": ctx.operation_id},
    )
    if response.status_code != 200:
        raise ToolError(f"mail service answered {response.status_code}: {response.text[:200]}",
                        code="mail_rejected")
    return _outcome(response.json())


@send_email.confirm
async def confirm_email(operation_id: str, args: EmailArgs, ctx: ToolContext) -> Any:
    """The delivery the mail service recorded under this operation id, or None."""
    response = await ctx.http.get(f"{ctx.settings.mail_url}/operations/{operation_id}")
    if response.status_code == 404:
        return None
    if response.status_code != 200:
        raise ToolError(f"mail service answered {response.status_code} to confirm",
                        code="confirm_failed")
    return _outcome(response.json())


def _outcome(op: dict[str, Any]) -> dict[str, Any]:
    return {"status": op.get("status"), "to": op.get("to"), "message_id": op.get("message_id"),
            "operation_id": op.get("operation_id")}
