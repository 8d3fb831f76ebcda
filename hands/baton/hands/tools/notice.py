"""Notice tools for task-driven delivery: ``deliver_notice`` (unsafe) and ``lookup_notice`` (safe).

Unlike ``send_email``, these leave recovery to the calling task: the task saves an operation
id before it sends and passes it in the arguments, ``deliver_notice`` sends it as the
``Idempotency-Key``, and when a delivery's outcome is uncertain the task asks
``lookup_notice`` whether the mail service recorded that operation.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from baton.app import ToolContext, tool
from baton.errors import ToolError

OPERATION_ID = r"^[A-Za-z0-9_.:-]{1,200}$"


class NoticeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to: str = Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$", description="recipient address")
    subject: str = Field(max_length=300)
    body: str = Field(max_length=20_000)
    operation_id: str = Field(pattern=OPERATION_ID, description="the Idempotency-Key")


class LookupArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    operation_id: str = Field(pattern=OPERATION_ID)


@tool(replay="unsafe", timeout=30.0)
async def deliver_notice(args: NoticeArgs, ctx: ToolContext) -> dict[str, Any]:
    """Deliver one notice through the mail service under the caller's operation id.

    Declared ``unsafe``: a delivery whose reply was lost is not sent again by Hands; the run
    ends ``interrupted`` and the calling task confirms it with ``lookup_notice``.
    """
    response = await ctx.http.post(
        f"{ctx.settings.mail_url}/send",
        json={"to": args.to, "subject": args.subject, "body": args.body},
        headers={"Idempotency-Key": args.operation_id},
    )
    if response.status_code != 200:
        raise ToolError(f"mail service answered {response.status_code}: {response.text[:200]}",
                        code="mail_rejected")
    return _delivery(response.json())


@tool(replay="safe", timeout=15.0)
async def lookup_notice(args: LookupArgs, ctx: ToolContext) -> dict[str, Any]:
    """Whether the mail service recorded a delivery under this operation id (read-only)."""
    response = await ctx.http.get(f"{ctx.settings.mail_url}/operations/{args.operation_id}")
    if response.status_code == 404:
        return {"found": False, "operation_id": args.operation_id}
    if response.status_code != 200:
        raise ToolError(f"mail service answered {response.status_code} to a lookup",
                        code="lookup_failed")
    return {"found": True, **_delivery(response.json())}


def _delivery(op: dict[str, Any]) -> dict[str, Any]:
    return {"status": op.get("status"), "to": op.get("to"), "message_id": op.get("message_id"),
            "operation_id": op.get("operation_id")}
