"""Apps for the cancel and approval tests (``tests.control_apps:<name>`` for processes).

* ``slow_app``: the notices agent whose ``send_email`` waits ``TEST_SEND_DELAY_MS`` (default
  3 s) before it sends, cooperatively: a cancelled run stops during the wait, so a cancel
  that reaches it in time sends nothing.
* ``approval_app``: the notices agent whose ``send_email`` needs a person's approval of its
  exact arguments before it is dispatched.
* ``slow_batch_app``: the notice-batch example with a slow ``deliver_notice`` (the same
  cooperative wait before the send).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from baton.app import Agent, App, Tool, ToolContext
from baton.examples import notice_batch
from baton.hands.tools import deliver_notice, lookup_notice, send_email
from baton.hands.tools.email import EmailArgs

__all__ = ["SEND_DELAY_ENV", "approval_app", "slow_app", "slow_batch_app"]

SEND_DELAY_ENV = "TEST_SEND_DELAY_MS"


async def _pause(ctx: ToolContext) -> None:
    """Wait before acting; return early (and let the caller stop) once cancelled."""
    delay = int(os.environ.get(SEND_DELAY_ENV) or 3000) / 1000
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ctx.cancelled.wait(), delay)


async def _slow_send(args: EmailArgs, ctx: ToolContext) -> Any:
    await _pause(ctx)
    if ctx.cancelled.is_set():
        return {"to": args.to, "sent": False}
    return await send_email(args, ctx)


async def _slow_deliver(args: Any, ctx: ToolContext) -> Any:
    await _pause(ctx)
    if ctx.cancelled.is_set():
        return {"sent": False}
    return await deliver_notice(args, ctx)


_notices = Agent(name="notices", tools=("send_email",),
                 instructions="Send the approved notice to each customer, then summarise.")

_slow_email = Tool(_slow_send, name="send_email", replay="confirm", timeout=30.0,
                   description="Send one e-mail, after a pause.", args_model=EmailArgs)
_slow_email.confirm(send_email.confirm_fn)  # type: ignore[arg-type]
slow_app = App(agents=[_notices], tools=[_slow_email])

_gated_email = Tool(send_email.fn, name="send_email", replay="confirm", timeout=30.0,
                    description="Send one e-mail, once a person approved it.",
                    args_model=EmailArgs, approval=True)
_gated_email.confirm(send_email.confirm_fn)  # type: ignore[arg-type]
approval_app = App(agents=[_notices], tools=[_gated_email])

_slow_notice = Tool(_slow_deliver, name="deliver_notice", replay=deliver_notice.replay,
                    timeout=30.0, description=deliver_notice.description,
                    args_model=deliver_notice.args_model)
slow_batch_app = App(
    agents=[notice_batch.notice_batch],
    tools=[_slow_notice, lookup_notice],
    tasks=[notice_batch.batch, notice_batch.send_notice],
    documents=list(notice_batch.app.documents.values()),
)
