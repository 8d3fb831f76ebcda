"""The seed's five-mail example as durable custom tasks: a batch and one child per recipient.

    baton brain --app baton.examples.notice_batch:app
    baton hands --app baton.examples.notice_batch:app
    baton start notice-batch --wait --input '{"recipients": ["ada@example.com"],
                                              "subject": "Notice", "body": "..."}'

``notice-batch`` (phases ``plan`` -> ``summarise``) reads the "notice-plan" document, written
from the task's input when the task starts with one (or earlier, by an agent), starts one
``send-notice`` child per recipient, waits for all of them (``allSettled``) and writes the
"notice-summary" document, which is also its result.

``send-notice`` makes each delivery recoverable by the task itself::

    prepare ─▶ send ─▶ check ─ok──────────────────────────────────────▶ completed
                  ▲       └─ interrupted / failed (uncertain) ─▶ sleep ─▶ confirm ─▶ settle
                  └───────────────── not found (once) ───────────────────────────────┘
                                     found ─▶ completed, "confirmed by task"

* ``prepare`` saves the operation id in the checkpoint (derived from the child's id) BEFORE
  anything is sent; every send of this child carries it as the ``Idempotency-Key``.
* ``send`` calls ``deliver_notice``, declared ``replay="unsafe"``: when its worker dies after
  acting, Hands does not guess; the run ends ``interrupted`` and the task decides.
* ``confirm`` asks the mail service with ``lookup_notice`` (safe to repeat). Found: the
  delivery happened, adopt it. Not found: send again, once. A send still in flight could land
  after the lookup said "not found" (the race every lookup has), but the second send carries
  the same Idempotency-Key, so the mail service records at most one delivery either way.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from baton import Agent, App, DocumentType, PhaseContext, Step, Task, TaskDef
from baton.hands.tools import deliver_notice, lookup_notice

PLAN = "notice-plan"
SUMMARY = "notice-summary"
CONFIRM_AFTER_S = 2.0  # default pause before asking the mail service about an uncertain send
MAX_SENDS = 2
MAX_LOOKUPS = 3


class NoticePlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    recipients: list[str] = Field(min_length=1, max_length=1000)
    subject: str = Field(max_length=300)
    body: str = Field(max_length=20_000)


class NoticeSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    total: int
    delivered: int
    failed: int
    outcomes: dict[str, str]  # recipient -> "delivered" | "confirmed by task" | "failed: ..."


# ---------------------------------------------------------------------------- the batch

batch = TaskDef("notice-batch", version=1, start="plan")


@batch.phase("plan")
async def plan(task: Task, ctx: PhaseContext) -> Step:
    if "recipients" in task.input:
        ctx.write_document(PLAN, {k: task.input[k] for k in ("recipients", "subject", "body")})
    notice: NoticePlan | None = ctx.document(PLAN)
    if notice is None:
        return Step.fail(f"no {PLAN} document and no plan in the input")
    pause = float(task.input.get("confirm_after_s", CONFIRM_AFTER_S))
    children = [
        ctx.spawn("send-notice", {"to": to, "subject": notice.subject, "body": notice.body,
                                  "confirm_after_s": pause})
        for to in notice.recipients
    ]
    return Step.wait(children, policy="allSettled", then="summarise", children=children)


@batch.phase("summarise")
async def summarise(task: Task, ctx: PhaseContext) -> Step:
    outcomes = {}
    for child in ctx.results(ctx.data["children"]).values():
        to = child.input["to"]  # type: ignore[union-attr]
        if child.ok:
            outcomes[to] = child.result["recovery"]  # type: ignore[union-attr]
        else:
            outcomes[to] = f"failed: {child.reason}"  # type: ignore[union-attr]
    failed = sum(1 for v in outcomes.values() if v.startswith("failed"))
    summary = NoticeSummary(total=len(outcomes), delivered=len(outcomes) - failed,
                            failed=failed, outcomes=outcomes)
    ctx.write_document(SUMMARY, summary)
    return Step.complete(summary.model_dump())


# ---------------------------------------------------------------------------- one notice

send_notice = TaskDef("send-notice", version=1, start="prepare")


@send_notice.phase("prepare")
async def prepare(task: Task, ctx: PhaseContext) -> Step:
    return Step.goto("send", operation_id=f"{ctx.session_id}:{task.id}", sends=0, lookups=0)


@send_notice.phase("send")
async def send(task: Task, ctx: PhaseContext) -> Step:
    run = ctx.call_tool("deliver_notice", {
        "to": task.input["to"], "subject": task.input["subject"], "body": task.input["body"],
        "operation_id": ctx.data["operation_id"],
    })
    return Step.wait([run], then="check", run=run, sends=ctx.data["sends"] + 1)


@send_notice.phase("check")
async def check(task: Task, ctx: PhaseContext) -> Step:
    result = ctx.results([ctx.data["run"]])[ctx.data["run"]]
    if result.ok:
        return Step.complete(_delivered(task, result.output, "delivered"))  # type: ignore[union-attr]
    if result.outcome in ("interrupted", "failed"):  # type: ignore[union-attr]
        # It may or may not have been delivered: ask the mail service after a pause.
        return Step.sleep(seconds=_pause(task), then="confirm")
    return Step.fail(f"the mail service refused the notice: {result.error}")  # type: ignore[union-attr]


@send_notice.phase("confirm")
async def confirm(task: Task, ctx: PhaseContext) -> Step:
    run = ctx.call_tool("lookup_notice", {"operation_id": ctx.data["operation_id"]})
    return Step.wait([run], then="settle", lookup=run, lookups=ctx.data["lookups"] + 1)


@send_notice.phase("settle")
async def settle(task: Task, ctx: PhaseContext) -> Step:
    result = ctx.results([ctx.data["lookup"]])[ctx.data["lookup"]]
    if not result.ok:  # type: ignore[union-attr]
        if ctx.data["lookups"] < MAX_LOOKUPS:
            return Step.sleep(seconds=_pause(task), then="confirm")
        return Step.fail(f"the delivery could not be confirmed: {result.error}")  # type: ignore[union-attr]
    found = result.output  # type: ignore[union-attr]
    if found["found"]:
        return Step.complete(_delivered(task, found, "confirmed by task"))
    if ctx.data["sends"] < MAX_SENDS:  # not delivered: the same Idempotency-Key again
        return Step.goto("send")
    return Step.fail(f"not delivered after {ctx.data['sends']} sends")


def _pause(task: Task) -> float:
    return float(task.input.get("confirm_after_s", CONFIRM_AFTER_S))


def _delivered(task: Task, output: dict[str, Any], recovery: str) -> dict[str, Any]:
    return {"to": task.input["to"], "message_id": output.get("message_id"),
            "operation_id": output.get("operation_id"), "recovery": recovery}


# ---------------------------------------------------------------------------- the app

notice_batch = Agent(
    name="notice-batch",
    instructions="Deliver an approved notice plan, one durable task per recipient.",
    tools=("deliver_notice", "lookup_notice"),
)

app = App(
    agents=[notice_batch],
    tools=[deliver_notice, lookup_notice],
    tasks=[batch, send_notice],
    documents=[DocumentType(PLAN, NoticePlan), DocumentType(SUMMARY, NoticeSummary)],
)
