"""Apps for the crash tests, loaded by the Brain and Hands processes as ``tests.apps:<name>``.

* ``slow_app``: the notices agent with a model that stalls before it answers, so a test can
  SIGSTOP the Brain while it holds a session's lease in the ``request`` phase.
* ``blocking_app``: the notices agent whose ``send_email`` (replay ``confirm``) sends with a
  blocking HTTP call, like a tool built on a synchronous SDK: a Hands SIGSTOPped mid-send
  comes back, sees the reply and tries to complete before any heartbeat could tell it that
  it lost the attempt, so its late complete reaches the fence.
* ``unsafe_app`` / ``safe_app``: the notices agent whose ``send_email`` is declared with
  replay policy ``unsafe`` / ``safe`` (no confirm), to check each policy's recovery at
  process level. The scripted model calls ``send_email`` by name, so the tool keeps it.

Every effect goes to the bundled mail service, whose ``/stats`` is the effect counter:
``raw_requests`` counts executions, ``deliveries`` what reached each recipient.
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx

from baton.app import Agent, App, Tool, ToolContext
from baton.brain.model import ModelRequest, ModelResponse
from baton.brain.scripted import ScriptedModel
from baton.errors import ToolError
from baton.hands.tools.email import EmailArgs, confirm_email, send_email

__all__ = ["MODEL_DELAY_ENV", "SLOW_MODEL", "blocking_app", "safe_app", "slow_app", "unsafe_app"]

SLOW_MODEL = "slow-scripted"
MODEL_DELAY_ENV = "TEST_MODEL_DELAY_MS"  # read by the Brain process when it builds the model
_DEFAULT_DELAY_MS = 500


class SlowScriptedModel:
    """The scripted model after a stall that does not yield to the event loop.

    The stall blocks like a synchronous SDK call or a long GC pause: while it lasts the
    Brain neither renews its lease nor heartbeats its wake, and once it ends the response is
    committed before anything else runs. So a Brain SIGSTOPped inside the stall and resumed
    after a takeover reaches its commit first (and is refused by the fence), instead of
    finding out through a failed lease renewal. Keep the delay well under the lease time.
    """

    def __init__(self, delay_ms: int) -> None:
        self.delay_s = delay_ms / 1000
        self.inner = ScriptedModel()

    async def generate(self, request: ModelRequest) -> ModelResponse:
        time.sleep(self.delay_s)  # noqa: ASYNC251 - the point: a stall the loop cannot see
        return await self.inner.generate(request)


async def _send(args: EmailArgs, ctx: ToolContext) -> dict[str, Any]:
    """Send one e-mail through the mail service (no confirm: the policy decides recovery)."""
    response = await ctx.http.post(
        f"{ctx.settings.mail_url}/send",
        json=args.model_dump(),
        headers={"Idempotency-Key": ctx.operation_id},
    )
    if response.status_code != 200:
        raise ToolError(f"mail service answered {response.status_code}", code="mail_rejected")
    op = response.json()
    return {"to": op.get("to"), "message_id": op.get("message_id"),
            "duplicate": op.get("duplicate")}


def _send_blocking(args: EmailArgs, ctx: ToolContext) -> dict[str, Any]:
    with httpx.Client(timeout=30.0) as http:
        response = http.post(f"{ctx.settings.mail_url}/send", json=args.model_dump(),
                             headers={"Idempotency-Key": ctx.operation_id})
    if response.status_code != 200:
        raise ToolError(f"mail service answered {response.status_code}", code="mail_rejected")
    op = response.json()
    return {"to": op.get("to"), "message_id": op.get("message_id"),
            "duplicate": op.get("duplicate")}


async def _send_sync_sdk(args: EmailArgs, ctx: ToolContext) -> dict[str, Any]:
    """Send one e-mail with a blocking call (the event loop waits with it)."""
    return _send_blocking(args, ctx)


def _notices(model: str = "scripted") -> Agent:
    return Agent(name="notices", compat=1, model=model, tools=("send_email",),
                 instructions="Send the approved notice to each customer, then summarise.")


def _email_tool(replay: str) -> Tool:
    return Tool(_send, name="send_email", replay=replay,  # type: ignore[arg-type]
                description=f"Send one e-mail (replay policy {replay}).", timeout=30.0)


slow_app = App(
    agents=[_notices(SLOW_MODEL)],
    tools=[send_email],
    models={SLOW_MODEL: SlowScriptedModel(
        int(os.environ.get(MODEL_DELAY_ENV) or _DEFAULT_DELAY_MS))},
)
_blocking_email = Tool(_send_sync_sdk, name="send_email", replay="confirm", timeout=30.0,
                       description="Send one e-mail through a synchronous client.")
_blocking_email.confirm(confirm_email)
blocking_app = App(agents=[_notices()], tools=[_blocking_email])
unsafe_app = App(agents=[_notices()], tools=[_email_tool("unsafe")])
safe_app = App(agents=[_notices()], tools=[_email_tool("safe")])
