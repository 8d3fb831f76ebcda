"""The relays in a trace: a lane per relay, a publish per stream message, hops through it."""

from __future__ import annotations

import json
import re
from typing import Any

from baton.cli.trace import Timeline, build_trace, render_text
from baton.cli.trace.html import render_html
from baton.receipts import Receipt

CLIENT = {"role": "client", "name": "client-1", "pid": 9}
BRAIN = {"role": "brain", "name": "brain-1", "pid": 10}
HANDS1 = {"role": "hands", "name": "hands-1", "pid": 11}
HANDS2 = {"role": "hands", "name": "hands-2", "pid": 12}
T0 = 1_700_000_000_000


def _receipt(n: int, kind: str, worker: dict[str, Any], ts: int, data: dict[str, Any], *,
             seq: int = 0, fence: int = 1) -> Receipt:
    return Receipt.from_stream(f"{T0 + ts}-{n}", {
        "seq": str(seq), "kind": kind, "worker": json.dumps(worker), "fence": str(fence),
        "ts": str(T0 + ts), "data": json.dumps(data)})


def _carrier(relay: str, at: int, row: str, stream_seq: int, delivery: int = 1) -> dict[str, Any]:
    return {"relay": relay, "published_ms": T0 + at, "row_id": row, "stream_seq": stream_seq,
            "delivery": delivery}


def _story() -> list[Receipt]:
    """Submit, dispatch, hands-1 claims and dies, the stream message is redelivered to
    hands-2, whose completion wakes the Brain through a second relay (whose clock runs late:
    it says it published after the lease it caused)."""
    tool_row = _carrier("relay-1", 22, "s-1/2/0", 7)
    return [
        _receipt(0, "submit", CLIENT, 0, {"detail": {"submission_id": "sub-1",
                                                      "task_id": "t"}}, seq=1),
        _receipt(1, "lease", BRAIN, 10, {"previous_holder": "", "previous_fence": 0,
                                         "carrier": _carrier("relay-1", 4, "s-1/1/0", 1)}),
        _receipt(2, "commit", BRAIN, 20, {"kind": "tools", "detail": {
            "task_id": "t", "turn": 1, "runs": ["t-1-0"]}}, seq=2),
        _receipt(3, "claim", HANDS1, 30, {"run_id": "t-1-0", "attempt": 1, "accepted_mark": 1,
                                          "delivery": 1, "carrier": tool_row}),
        _receipt(4, "reclaim", HANDS2, 3000, {
            "run_id": "t-1-0", "attempt": 2, "previous_attempt": 1,
            "previous_status": "running", "previous_worker": "hands-1", "delivery": 2,
            "carrier": {**tool_row, "delivery": 2}}, fence=2),
        _receipt(5, "complete", HANDS2, 3010, {
            "marks": [{"run_id": "t-1-0", "mark": "completed", "attempt": 2}],
            "detail": {"run_id": "t-1-0", "tool": "send", "outcome": "ok"}}, seq=3, fence=2),
        _receipt(6, "lease", BRAIN, 3020, {"previous_holder": "", "previous_fence": 1,
                                           "carrier": _carrier("relay-2", 3025, "s-1/3/0", 2)},
                 fence=2),
    ]


def test_a_redelivery_hangs_off_the_same_publish_on_the_relays_lane() -> None:
    trace = build_trace("s-1", _story())
    data = json.loads(json.dumps(trace.to_json()))
    assert [(lane["role"], lane["name"]) for lane in data["lanes"]] == [
        ("client", "client-1"), ("relay", "relay-1"), ("relay", "relay-2"),
        ("brain", "brain-1"), ("hands", "hands-1"), ("hands", "hands-2")]
    relay1 = data["lanes"][1]
    assert relay1["published"] == 2 and relay1["events"] == 0 and relay1["pid"] == 0
    assert (relay1["first_ms"], relay1["last_ms"]) == (4, 22)
    pubs = data["publishes"]
    assert [(p["relay"], p["row_id"], p["source"], p["deliveries"], p["outbox_ms"])
            for p in pubs] == [("relay-1", "s-1/1/0", 0, [1], 4),
                               ("relay-1", "s-1/2/0", 2, [3, 4], 2),
                               ("relay-2", "s-1/3/0", 5, [6], 15)]
    hops = {c["event"]: c for c in data["carriers"]}
    assert hops[3]["publish"] == hops[4]["publish"] == 1
    assert (hops[4]["delivery"], hops[4]["outbox_ms"], hops[4]["transit_ms"]) == (2, 2, 2978)
    assert all(data["events"][c["event"]]["lane"] != pubs[c["publish"]]["lane"]
               for c in data["carriers"])

    text = render_text(trace)
    assert re.search(r"relay\s+relay-1\s+published\s+2, .*\(3 deliveries acted on, 1 of them "
                     r"JetStream's redeliveries\)", text)
    assert re.search(r"relay\s+relay-2\s+published\s+1, .*\(1 delivery acted on\)", text)
    # the second delivery of one publish says it is one, not a second publish
    assert "(stream seq" in text and "delivery 2: JetStream's redelivery of that publish)" in text
    assert "-> hands-2 claimed run 1-0 [2 ms in the outbox, 2978 ms from publish to hands-2]" \
        in text


def _x(html: str, cls: str) -> list[float]:
    return [float(m) for m in re.findall(rf'<g class="{cls}[^"]*"><(?:circle|rect) c?x="([\d.]+)"',
                                          html)]


def test_the_picture_draws_commit_publish_consumer_and_a_redelivery_in_red() -> None:
    trace = build_trace("s-1", _story())
    html = render_html(trace)
    assert "<script" not in html and "http" not in html
    assert '<g class="lane relay">' in html and ">relay-1</text>" in html
    assert html.count('<g class="publish">') == 3
    # two segments per publish with a source, one per delivery; the redelivery is red dashed
    assert html.count('class="relayed dispatch"') == 2  # commit -> publish, -> hands-1
    assert html.count('class="relayed wake"') == 4
    assert html.count('class="relayed redelivery"') == 1 and "redelivery 2" in html
    # the relayed wake and dispatch hops are not drawn a second time as direct arrows
    assert html.count('class="handoff wake"') == 0 and html.count('class="handoff dispatch"') == 0
    assert html.count('class="handoff takeover"') == 1
    # every publish sits after the commit that wrote its row and before its first consumer,
    # even relay-2's, whose clock says it published after the lease it caused
    events, pubs = _x(html, "event"), _x(html, "publish")
    assert len(events) == 7 and events == sorted(events)
    for x, p in zip(pubs, trace.publishes, strict=True):
        assert p.source is not None and events[p.source] < x < events[p.deliveries[0]]


def test_the_runs_of_two_tasks_get_labels_that_tell_them_apart() -> None:
    """Run ids are ``<task>-<turn>-<n>``: two tasks' first runs are both ``1-0``; the runs
    of any task but the first one seen also show the end of their task id."""
    timeline = Timeline("s-1")
    first, second = "t-aaaaaa111111-1-0", "t-bbbbbb222222-1-0"
    assert timeline._short(first) == "run 1-0"
    assert timeline._short(second) == "run 222222/1-0"
    assert timeline._short(first) == "run 1-0"  # stable once the first task is known
    assert timeline.trace().first_task == "t-aaaaaa111111"


def test_a_lease_woken_by_a_cancel_names_the_cancel_not_the_commit_before_it() -> None:
    """A client's cancel (and approval) writes its wake row under the session's last seq
    (``<sid>/<seq>/c.<ms>``): the lease it brings is the cancel's, whatever that seq's commit."""
    story = [
        *_story(),
        _receipt(7, "commit", BRAIN, 3030, {"kind": "blocked", "detail": {"task_id": "t"}},
                 seq=4, fence=2),
        _receipt(8, "cancel", CLIENT, 5000, {"detail": {"target": "*", "reason": "stop"}},
                 seq=4),
        _receipt(9, "lease", BRAIN, 5040, {
            "previous_holder": "", "previous_fence": 2,
            "carrier": _carrier("relay-1", 5020, f"s-1/4/c.{T0 + 5000}", 9)}, fence=3),
        _receipt(10, "reject", CLIENT, 6000, {"detail": {"run_id": "t-1-0", "reason": "no"}},
                 seq=5),
        _receipt(11, "lease", BRAIN, 6030, {
            "previous_holder": "", "previous_fence": 3,
            "carrier": _carrier("relay-1", 6010, f"s-1/5/d.{T0 + 6000}", 10)}, fence=4),
    ]
    text = render_text(build_trace("s-1", story))
    woken = [line for line in text.splitlines() if "woken by" in line]
    assert "woken by cancel of client-1, wake hop 40 ms" in woken[-2], woken
    assert "woken by reject of client-1, wake hop 30 ms" in woken[-1], woken


def test_a_brain_restarted_under_its_name_takes_over_on_a_redelivered_wake() -> None:
    """The lease of a Brain that died holding it is taken by its successor of the same name
    from the wake JetStream delivered again: the trace shows the takeover, the redelivery and
    the dead process's lane left with the lease."""
    reborn = {**BRAIN, "pid": 20}
    receipts = [
        _receipt(0, "submit", CLIENT, 0, {"detail": {"submission_id": "sub-1",
                                                      "task_id": "t"}}, seq=1),
        _receipt(1, "lease", BRAIN, 10, {"previous_holder": "", "previous_fence": 0,
                                         "carrier": _carrier("relay-1", 4, "s-1/1/0", 1)}),
        _receipt(2, "takeover", reborn, 2000, {
            "previous_holder": "brain-1", "previous_fence": 1,
            "carrier": _carrier("relay-1", 4, "s-1/1/0", 1, delivery=2)}, fence=2),
    ]
    trace = build_trace("s-1", receipts)
    ev = trace.events[2]
    assert "takeover" in ev.flags and "redelivery" in ev.flags
    assert "REDELIVERY of the wake (delivery 2)" in ev.text
    assert [h.kind for h in trace.handoffs].count("takeover") == 1
    dead = next(lane for lane in trace.lanes if lane.pid == 10)
    assert dead.left_lease == 1
    text = render_text(trace)
    assert re.search(r"brain-1 \(pid 10\).*left the session lease s:1 unreleased", text)
    assert re.search(r"redeliveries\W+1", text), text
    assert "DIED?" in render_html(trace)


def test_a_lane_taken_over_that_came_back_is_not_said_to_have_died() -> None:
    """hands-1 paused past its attempt, taken over, then resumed: its complete was refused
    after the takeover, yet the lane read 'no receipt after (process died or was cut off)'."""
    died = render_text(build_trace("s-1", _story()))
    assert re.search(r"hands-1 .*left run 1-0 attempt 1 without a result; no receipt after",
                     died)
    came_back = [*_story(), _receipt(7, "refused", HANDS1, 3500, {
        "op": "complete", "run_id": "t-1-0", "current": 2, "status": "completed"})]
    text = render_text(build_trace("s-1", came_back))
    line = next(x for x in text.splitlines() if "hands-1 (pid 11)" in x and "<-" in x)
    assert "taken over while silent, it came back later" in line
    assert "no receipt after" not in line


def test_a_held_recheck_after_an_approval_is_the_approvals_and_dispatch_runs_from_its_commit(
) -> None:
    """A tools commit saves two runs, one gated: the other completes, then a person approves
    the gated one and the holding Brain rechecks. The recheck is the approval's (not the
    completion's before it), and the approved run's dispatch hop runs from the commit that
    carried the approval out."""
    story = [
        _receipt(0, "submit", CLIENT, 0, {"detail": {"submission_id": "sub-1",
                                                      "task_id": "t"}}, seq=1),
        _receipt(1, "lease", BRAIN, 10, {"previous_holder": "", "previous_fence": 0,
                                         "carrier": _carrier("relay-1", 4, "s-1/1/0", 1)}),
        _receipt(2, "commit", BRAIN, 20, {"kind": "tools", "changes": {"runs": 2, "outbox": 1},
                                          "detail": {"task_id": "t", "turn": 1,
                                                     "runs": ["t-1-0", "t-1-1"]}}, seq=2),
        _receipt(3, "claim", HANDS1, 30, {"run_id": "t-1-0", "attempt": 1, "accepted_mark": 1,
                                          "carrier": _carrier("relay-1", 25, "s-1/2/0", 2)}),
        _receipt(4, "complete", HANDS1, 40, {"detail": {"run_id": "t-1-0", "tool": "send",
                                                        "outcome": "ok"}}, seq=2),
        _receipt(5, "approve", CLIENT, 9000, {"detail": {"run_id": "t-1-1", "tool": "send",
                                                         "digest": "d" * 64}}, seq=2),
        _receipt(6, "held", BRAIN, 9010, {"heard": True, "hold_ms": 8990}),
        _receipt(7, "commit", BRAIN, 9020, {"kind": "decisions", "changes": {"outbox": 1},
                                            "detail": {"approved": ["t-1-1"], "rejected": []}},
                 seq=3),
        _receipt(8, "claim", HANDS1, 9030, {"run_id": "t-1-1", "attempt": 1,
                                            "carrier": _carrier("relay-1", 9025, "s-1/3/0", 3)}),
    ]
    trace = build_trace("s-1", story)
    ev = trace.events
    assert "2 tool run(s) saved (1 dispatched, 1 awaiting approval)" in ev[2].text
    assert (ev[6].woken_by, ev[6].waker, ev[6].hops["wake"]) == ("approve", 5, 10)
    wakes = [(h.src, h.dst) for h in trace.handoffs if h.kind == "wake"]
    assert (5, 6) in wakes and not [w for w in wakes if w[0] == 4]
    runs = {r.run_id: r for r in trace.runs}
    assert runs["t-1-1"].approved_ms == T0 + 9000 and runs["t-1-1"].dispatched_ms == T0 + 9020
    assert runs["t-1-1"].dispatch_hop == 10 and ev[8].hops["dispatch"] == 10
    assert [(h.src, h.dst) for h in trace.handoffs if h.kind == "dispatch"][-1] == (7, 8)
    assert "decisions carried out: run 1-1 approved, dispatched" in ev[7].text
