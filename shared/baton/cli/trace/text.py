"""The handoff timeline as plain text (``baton trace``, the demo's last screen)."""

from __future__ import annotations

from baton.cli.trace.model import (
    Trace,
    archived_line,
    quarantine_line,
    row_cause,
    secs,
    short_run,
)

__all__ = ["render_text"]


def render_text(trace: Trace, *, width: int = 28) -> str:
    """Plain text: the lanes, one line per receipt, then hops, takeovers and refusals."""
    quarantined = quarantine_line(trace.quarantine)
    notes = [line for line in (archived_line(trace.archived_ms), quarantined) if line]
    if not trace.events:
        return "".join(f"{line}\n" for line in [f"session {trace.session_id}: no receipts",
                                                *notes])
    lanes = {lane.id: lane for lane in trace.lanes}
    out = [f"session {trace.session_id}: {len(trace.events)} receipts, {len(trace.lanes)} "
           f"processes, {trace.duration_ms / 1000:.3f}s",
           "fences: s:N = session lease fence (Brain), a:N = tool-run attempt fence (Hands)",
           "processes:"]
    out[1:1] = notes
    carried, again = trace.relays, trace.redelivered
    for lane in trace.lanes:
        if lane.role == "relay":
            acted, redone = carried.get(lane.name, 0), again.get(lane.name, 0)
            out.append(f"  {'relay':<6} {lane.label:<{width}} published {lane.published:>3}, "
                       f"{secs(lane.first_ms)} .. {secs(lane.last_ms)}  "
                       f"({acted} deliver{'y' if acted == 1 else 'ies'} acted on"
                       + (f", {redone} of them JetStream's redeliveries" if redone else "")
                       + ")")
            continue
        parts = []
        if lane.abandoned:
            runs = ", ".join(
                f"{short_run(a.split('@')[0], trace.first_task)} attempt {a.split('@')[1]}"
                for a in lane.abandoned)
            parts.append(f"left {runs} without a result")
        if lane.left_lease is not None:
            parts.append(f"left the session lease s:{lane.left_lease} unreleased")
        # silent since (it died, or was cut off), or back later: its writes then refused
        after = ("no receipt after (process died or was cut off)"
                 if lane.last_ms <= lane.taken_over_ms else
                 "taken over while silent, it came back later (its late writes refused)")
        note = f"  <- {'; '.join(parts)}; {after}" if parts else ""
        out.append(f"  {lane.role:<6} {lane.label:<{width}} receipts {lane.events:>3}, "
                   f"{secs(lane.first_ms)} .. {secs(lane.last_ms)}{note}")
    out.append("")
    out.append(f"  {'t':>9}  {'process':<{width}} {'fence':<6} {'event':<17} what")
    for e in trace.events:
        lane = lanes[e.lane]
        mark = ">>" if {"takeover", "refused"} & set(e.flags) else "  "
        out.append(f"{mark}{secs(e.t_ms)}  {lane.label:<{width}} {e.fence:<6} {e.kind:<17} "
                   f"{e.text}")
    out += ["", "tool runs (hops from commit timestamps):"]
    for r in trace.runs:
        attempts = "; ".join(
            f"a:{a['attempt']} {a['worker']} "
            + (f"via {a['via']} " if a.get("via") else "")
            + (f"{a['ended_ms'] - a['claimed_ms']} ms {a['result']}" if a["ended_ms"]
               else "no result") for a in r.attempts) or "never claimed"
        waited = (f" (of which {r.slot_wait_ms} ms waiting for a slot)"
                  if r.slot_wait_ms is not None else "")
        if r.awaiting_approval:
            waited += " (awaiting approval)"
        elif r.rejected:
            waited += " (rejected: never dispatched)"
        elif r.approved_ms is not None:  # the hop runs from the dispatch, after the approval
            waited += f" (approved at {secs(r.approved_ms - trace.t0_ms).strip()})"
        out.append(f"  {short_run(r.run_id, trace.first_task):<10} {r.tool or '?':<11} dispatch "
                   f"{_ms(r.dispatch_hop)}{waited}  [{attempts}]  apply {_ms(r.apply_hop)}  "
                   f"recovery {r.recovery or '-'}, message deliveries {r.deliveries}")
    if trace.carried:
        out.append("message hops (outbox row -> relay -> the process that acted on it):")
        for c in trace.carried:
            src = trace.events[c.source] if c.source is not None else None
            origin = (f"{src.kind} of {lanes[src.lane].name}" if src is not None
                      else row_cause(c.row_id))
            waits = ", ".join(
                [*([f"{c.outbox_ms} ms in the outbox"] if c.outbox_ms is not None else []),
                 *([f"{c.transit_ms} ms from publish to {c.consumer}"]
                   if c.transit_ms is not None else [])])
            out.append(f"  {secs(trace.events[c.event].t_ms)} {c.describe(origin)}"
                       + (f" [{waits}]" if waits else ""))
    if trace.model_attempts:
        out.append("model attempts (status, error, wait before the next attempt, usage):")
        out += [f"  {secs(a.t_ms)} {a.describe()}" for a in trace.model_attempts]
    wakes = [h for h in trace.handoffs if h.kind == "wake"]
    if wakes:
        out.append("wake hops: " + ", ".join(f"{h.ms} ms" for h in wakes))
    for title, flag in (("takeovers", "takeover"), ("refused stale writes", "refused"),
                        ("confirm / recovery outcomes", "confirm"),
                        ("redeliveries", "redelivery"), ("retries", "retry"),
                        ("cancellations", "cancel"), ("approvals", "approval"),
                        ("versions (migrations, blocked tasks)", "version")):
        found = trace.flagged(flag) + (trace.flagged("recovery") if flag == "confirm" else [])
        out.append(f"{title}: {len(found) or 'none'}")
        out += [f"  {secs(e.t_ms)} {lanes[e.lane].label}: {e.text}" for e in found]
    ended = [e for e in trace.flagged("slot") if "slot_wait" in e.hops]
    if ended:  # only when a run waited: most tools are not capped
        out.append(f"waits for a capped tool's slot: {len(ended)}, "
                   f"longest {max(e.hops['slot_wait'] for e in ended)} ms")
        out += [f"  {secs(e.t_ms)} {lanes[e.lane].label}: {e.text}" for e in ended]
    return "\n".join(out) + "\n"


def _ms(value: int | None) -> str:
    return f"{value} ms" if value is not None else "-"
