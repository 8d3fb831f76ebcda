"""``baton trace`` credits each wake to what caused it (real servers, one event loop).

A wake comes from a tool's completion, a client's submission, a person's approval or
rejection, a timer that fired, or a restore; each lease (or held recheck) names that cause,
and its wake hop and the row's wait in the outbox are measured from it alone, never from
an earlier completion. A run gated for approval reads as awaiting approval until the
approval, and as dispatched by the Brain's commit that carried the approval out.
"""

from __future__ import annotations

from typing import Any

from baton.cli.trace import Trace, build_trace, render_text
from baton.cli.trace.html import render_html
from baton.cli.trace.model import Event, short_run
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.settings import Settings
from tests.control_apps import approval_app
from tests.helpers import eventually, running, trio
from tests.integration.model_runs import APPS, model_settings, run_notices
from tests.model_server import Behaviour, ModelServer

TWO = "Send the approved notice to ada@example.com and grace@example.com, then summarise."


def _woken(trace: Trace, src: Event) -> Event:
    """The lease (or held recheck) the wake handoff from ``src`` reached; exactly one."""
    found = [trace.events[h.dst] for h in trace.handoffs if h.kind == "wake" and h.src == src.index]
    assert len(found) == 1, (src.text, [h.text for h in trace.handoffs if h.kind == "wake"])
    return found[0]


async def test_an_approval_wakes_the_session_and_the_run_waits_for_it_not_for_a_hop(
    settings: Settings, mailbox: MailboxServer
) -> None:
    settings = settings.model_copy(update={"mail_url": mailbox.url})
    async with running(*trio(settings, approval_app)), Client.connect(settings) as client:
        sub, _ = await client.submit(TWO, agent="notices")
        sid = sub.session_id

        async def awaiting() -> list[Any]:
            found = [r for r in (await client.store.load(sid)).runs.values()
                     if r.status == "awaiting_approval"]
            return found if len(found) == 2 else []
        ada, grace = sorted(await eventually(awaiting, timeout=10), key=lambda r: r.run_id)
        # Before any decision: both runs read as awaiting approval, none as dispatched.
        early = build_trace(sid, await client.store.receipts(sid))
        gated = next(e for e in early.events if e.kind == "commit:tools")
        assert "awaiting approval" in gated.text and "dispatched" not in gated.text, gated.text
        assert all(r.awaiting_approval and r.dispatched_ms is None for r in early.runs)

        # ada's run is approved; its tool completes (the causal step before grace's decision)
        await client.approve(sid, ada.run_id, ada.intent.approval_digest or "")

        async def ada_done() -> bool:
            return (await client.store.runs.get(sid, ada.run_id)).status == "completed"
        await eventually(ada_done, timeout=10)
        await client.reject(sid, grace.run_id, "not this one")
        final = await client.wait(sub, timeout=15)
        receipts = await client.store.receipts(sid)
    assert final.status == "completed", final
    trace = build_trace(sid, receipts)
    events = trace.events
    approve = next(e for e in events if e.kind == "approve")
    reject = next(e for e in events if e.kind == "reject")
    completed = next(e for e in events if e.kind == "complete")
    assert approve.index < completed.index < reject.index  # the completion came in between

    # Each decision woke the session: the wake hop runs from it, not from the completion.
    for decision in (approve, reject):
        woke = _woken(trace, decision)
        assert woke.kind in ("lease", "held") and woke.index > decision.index
        assert woke.hops["wake"] == woke.ts_ms - decision.ts_ms
        assert f"woken by {decision.kind}" in woke.text, woke.text
        if woke.carrier is not None:  # through the relay: the row waited from the decision
            pub = trace.publishes[woke.carrier.publish or 0]
            assert pub.source == decision.index and f"d.{decision.run_id}" in pub.row_id
            assert pub.outbox_ms == pub.published_ms - decision.ts_ms
    # Nothing a decision caused is credited to the completion before it.
    assert not [h for h in trace.handoffs if h.kind == "wake" and h.src == completed.index
                and events[h.dst].index > reject.index]

    # ada's run: awaiting approval until approved, then dispatched by the Brain's commit
    # that carried the approval out; its dispatch hop runs from that commit.
    runs = {r.run_id: r for r in trace.runs}
    carried_out = next(e for e in events if e.kind == "commit:decisions"
                       and f"{short_run(ada.run_id, trace.first_task)} approved" in e.text)
    assert carried_out.index > approve.index
    assert runs[ada.run_id].approved_ms == approve.ts_ms
    assert runs[ada.run_id].dispatched_ms == carried_out.ts_ms
    claim = next(e for e in events if e.kind == "claim" and e.run_id == ada.run_id)
    assert claim.hops["dispatch"] == claim.ts_ms - carried_out.ts_ms
    dispatch = next(h for h in trace.handoffs if h.kind == "dispatch" and h.dst == claim.index)
    assert dispatch.src == carried_out.index
    assert runs[grace.run_id].dispatched_ms is None and runs[grace.run_id].rejected
    assert not runs[ada.run_id].awaiting_approval and not runs[grace.run_id].awaiting_approval

    # The three views say the same.
    text = render_text(trace)
    assert "2 tool run(s) awaiting approval" in text
    assert f"woken by approve of {trace.lanes_by_id[approve.lane].name}" in text
    data = trace.to_json()
    assert data["runs"][0]["approved_ms"] == approve.ts_ms
    assert data["events"][_woken(trace, approve).index]["waker"] == approve.index
    html = render_html(trace)
    assert "awaiting approval" in html and "woken by approve" in html


async def test_a_timer_wake_is_the_timers_not_the_last_completions(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer
) -> None:
    """The model call after the five results fails with a 429: its retry waits on a durable
    timer, whose firing wakes the session. That lease is the timer's: no receipt woke it, so
    no wake hop and no wait in the outbox are timed from the completions before it."""
    model_server.script(Behaviour(), Behaviour(status=429, retry_after=0.3))
    out = await run_notices(model_settings(settings, model_server), APPS["openai"], mailbox)
    assert out.final.status == "completed", out.final
    trace = build_trace(out.final.session_id, out.receipts)
    events = trace.events
    retry = next(e for e in events if e.kind == "commit:retry")
    assert any(e.kind == "complete" for e in events[:retry.index])  # completions came first
    woke = next(e for e in events[retry.index:] if e.kind == "lease")
    assert woke.carrier is not None and woke.carrier.timer
    assert woke.woken_by == "timer" and woke.waker is None
    assert "wake" not in woke.hops and "woken by a task timer that fired" in woke.text
    assert not [h for h in trace.handoffs if h.dst == woke.index]
    pub = trace.publishes[woke.carrier.publish or 0]
    assert pub.timer and pub.source is None and pub.outbox_ms is None
    # the next lease took up the retry: the model attempt after the timer
    resumed = next(e for e in events[woke.index:] if e.kind == "commit:resume")
    assert resumed.lane == woke.lane
    data = trace.to_json()["events"][woke.index]
    assert data["woken_by"] == "timer" and data["waker"] is None
    assert "woken by a task timer that fired" in render_text(trace)
    assert "woken by a task timer that fired" in render_html(trace)
