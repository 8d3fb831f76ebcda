"""A person's decisions on runs awaiting approval, carried out by the Brain.

    client ── approve.lua ──▶ inbox decide:<run id> = {decision, ms, result}  (with a wake)
    Brain, on load ── one commit ──▶ approved: the run's dispatch row, status 'dispatched'
        and its approval time; rejected: the run completed with the rejection's result (the
        task applies it like any other); both inbox requests deleted

The client writes only its request: the dispatch row and the run's status are the Brain's,
written under its fence. A decision on a run that awaits no approval any more (cancelled
meanwhile) is dropped.
"""

from __future__ import annotations

from baton.brain.context import TaskContext
from baton.brain.phases import dispatch_row
from baton.store.writes import Writes

__all__ = ["consume_decisions"]


async def consume_decisions(ctx: TaskContext) -> None:
    """Carry out the decisions recorded in the session's inbox, in one commit."""
    decisions = ctx.state.decisions
    if not decisions:
        return
    writes = Writes(kind="decisions", meta_del=[f"decide:{rid}" for rid in sorted(decisions)])
    for rid in sorted(decisions):
        d, run = decisions[rid], ctx.state.runs.get(rid)
        if run is None or run.status != "awaiting_approval":
            continue
        if d.decision == "approve":
            writes.approve_runs[rid] = d.ms
            writes.outbox.append(dispatch_row(run.intent, ctx))
        else:
            writes.reject_runs[rid] = d.result
    ctx.log.info("decisions_carried_out", approved=sorted(writes.approve_runs),
                 rejected=sorted(writes.reject_runs), dropped=sorted(
                     set(decisions) - set(writes.approve_runs) - set(writes.reject_runs)))
    writes.detail = {"approved": sorted(writes.approve_runs),
                     "rejected": sorted(writes.reject_runs)}
    await ctx.commit(writes)
