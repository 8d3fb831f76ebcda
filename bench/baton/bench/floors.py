"""The floors the design's own hops set, measured in the same run as ``bench e2e``.

Figures, not assertions: what the targets against the plain loop ask, set beside what the
hops every five-notice session takes cost at best (raw chains of ``bench chain``, run on the
same servers), so an unmet target says whether the design or Baton's own work stands in
its way.
"""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console

from baton.bench.common import Row
from baton.settings import Settings

__all__ = ["RELAY_HOPS_HELD", "RELAY_HOPS_UNHELD", "floors"]

# Relay hops per five-notice session: submit -> Brain, Brain -> Hands, and Hands -> Brain
# unless the Brain holds its lease for the results (brain.held: they come by signal).
RELAY_HOPS_HELD, RELAY_HOPS_UNHELD = 2, 3
# Fenced commits the design's data flow (DESIGN section 3) puts in a row after those hops, one
# waiting for the other: the Hands' result (the "completed" mark), the Brain's "applied" mark
# and its final answer. The two chains already hold the submit, the lease, the intents and
# the claim (a chain is a commit, the relay, the consumer's commit).
FURTHER_COMMITS = 3


def floors(chain: Row, flows: Row, commit: Row, tool_p50_us: float, c1: Row, p1: Row,
           p32: Row | None, plain32: dict[str, float] | None, console: Console, *,
           c1_target: float, c32_target: float) -> dict[str, Any]:
    """What the design's own hops cost, measured in this run: the least a five-notice session
    could take if Baton did nothing but hand work over, beside the targets against the plain
    loop.

    * Concurrency 1: a session crosses two relay hops in a row (submit -> Brain, Brain ->
      Hands; three when Brains do not hold their leases for the results), each a raw chain at
      best, and waits for one tool call's own time (the five run in parallel); then the
      :data:`FURTHER_COMMITS` fenced commits that follow in a row, each at the raw commit's
      p50: the design's floor, before any work of Baton's own (two model turns, the state it
      reads, the results' signal, the client's read-back).
    * Concurrency 32: a session relays six messages (its wake and five dispatches), each a raw
      chain's CPU at 32 flows (this process, Redis and NATS); the five dispatches share one
      commit, so four fenced commits (timed one at a time: the dearest way) are taken off. With
      the mail service's CPU as the plain loop pays it, that bounds the sessions/s the
      machine's cores can run, before any model turn, state, receipt or trace.
    """
    out: dict[str, Any] = {}
    hops = RELAY_HOPS_HELD if Settings.from_env().brain_hold_ms > 0 else RELAY_HOPS_UNHELD
    floor_us = hops * chain.p50_us + tool_p50_us
    design_us = floor_us + FURTHER_COMMITS * commit.p50_us
    target_us = c1_target * p1.p50_us
    out["c1_floor"] = {"relay_hops": hops, "tool_p50_ms": tool_p50_us / 1000,
                       "floor_ms": floor_us / 1000, "floor_x_plain": floor_us / p1.p50_us,
                       "further_commits": FURTHER_COMMITS, "commit_p50_ms": commit.p50_us / 1000,
                       "design_floor_ms": design_us / 1000,
                       "design_floor_x_plain": design_us / p1.p50_us,
                       "left_for_baton_ms": (target_us - design_us) / 1000,
                       "target_x_plain": c1_target,
                       "p50_chains": c1.p50_us / chain.p50_us}
    console.print(f"[dim]concurrency 1: p50 {c1.p50_us / 1000:.1f} ms = "
                  f"{c1.p50_us / chain.p50_us:.1f} raw chains; its {hops} relay hops, one raw "
                  f"chain each, and one tool call's own time alone are {floor_us / 1000:.1f} ms "
                  f"= {floor_us / p1.p50_us:.2f}x the plain loop's p50; with the "
                  f"{FURTHER_COMMITS} fenced commits that follow in a row (the result, the "
                  f"applied mark, the final answer; {commit.p50_us:,.0f} µs each) "
                  f"{design_us / 1000:.1f} ms = {design_us / p1.p50_us:.2f}x (target "
                  f"{c1_target}x: {_left(target_us - design_us)} two model turns, the state "
                  f"reads, the results' signal and the client's read-back)[/dim]")
    parts = (flows.client_cpu_us, flows.server_cpu_us, commit.client_cpu_us,
             commit.server_cpu_us)
    if p32 is None or plain32 is None or any(x is None for x in parts):
        return out
    chain_cpu = float(flows.client_cpu_us or 0) + float(flows.server_cpu_us or 0)
    commit_cpu = float(commit.client_cpu_us or 0) + float(commit.server_cpu_us or 0)
    relayed, shared = 1 + 5, 4
    hops_ms = (relayed * chain_cpu - shared * commit_cpu) / 1000
    cores = os.cpu_count() or 1
    ceiling = cores * 1000 / (hops_ms + plain32["mailbox"])
    share = ceiling / p32.ops_per_s
    out["c32_ceiling"] = {"chain_cpu_us": chain_cpu, "commit_cpu_us": commit_cpu,
                          "hops_cpu_ms_per_session": hops_ms,
                          "mailbox_cpu_ms_per_session": plain32["mailbox"], "cores": cores,
                          "sessions_per_s": ceiling, "of_plain": share,
                          "target_of_plain": c32_target}
    console.print(f"[dim]concurrency 32: a session's {relayed} relayed messages at a raw "
                  f"chain's CPU ({chain_cpu:,.0f} µs at {flows.writers} flows, this process + "
                  f"Redis + NATS; {shared} shared commits of {commit_cpu:,.0f} µs off) alone "
                  f"are {hops_ms:.2f} ms; with the mail service's {plain32['mailbox']:.2f} ms, "
                  f"{cores} cores run at most {ceiling:,.0f} sessions/s = {share:.0%} of the "
                  f"plain loop (target {c32_target:.0%})[/dim]")
    return out


def _left(us: float) -> str:
    """What a target leaves above a floor, in words."""
    if us >= 0:
        return f"{us / 1000:.2f} ms left for"
    return f"already {-us / 1000:.2f} ms past it before"
