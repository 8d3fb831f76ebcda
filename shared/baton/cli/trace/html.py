"""``baton trace --html``: the handoff timeline as one self-contained HTML page.

A lane per process, the receipts as dots on their lane, attempts as bars from claim to
completion (an attempt that ended without a result is drawn red up to its takeover), and
handoffs as arrows between lanes: wakes, dispatches, and takeovers (red). Each relay has a
lane of its own with a dot per stream message it published, so a carried hop is drawn in two
segments, the commit that wrote the outbox row -> the relay's publish -> the consumer's lease
or claim; a redelivery (delivery > 1) leaves the same publish dot as a red dashed segment.
Everything has a hover title. No script, no external fonts, styles or images: the file opens
anywhere, and the plain-text trace is embedded below the picture.

Time runs left to right on a compressed scale built from the receipts and the publishes:
short gaps stay readable next to long waits, and a gap over :data:`BREAK_MS` is drawn as a
break labelled with its length.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from html import escape

from baton.cli.trace import Event, Publish, Trace, quarantine_line, render_text
from baton.cli.trace.model import archived_line, row_cause

__all__ = ["BREAK_MS", "render_html"]

BREAK_MS = 400
_LEFT, _TOP, _LANE_H, _RIGHT = 180, 70, 64, 40
_COLORS = {
    "submit": "#6b7280", "lease": "#2563eb", "held": "#2563eb", "takeover": "#dc2626",
    "commit": "#1d4ed8", "claim": "#059669", "reclaim": "#dc2626", "complete": "#047857",
    "refused": "#b91c1c", "slot_wait": "#ca8a04",
}
_ROLE_BG = {"brain": "#eef2ff", "hands": "#ecfdf5", "client": "#f3f4f6", "relay": "#fff7ed"}
_PUBLISH = "#ea580c"
_REDELIVERY = "#dc2626"
_HALO = ' stroke="white" stroke-width="3" paint-order="stroke"'  # text stays legible on lines
_ARROWS = (("wake", "#2563eb"), ("dispatch", "#059669"), ("takeover", "#dc2626"),
           ("redelivery", _REDELIVERY))


class _Axis:
    """The compressed time axis: x of every receipt and of every publish with a time.

    A publish is placed after its source commit and before its first consumer whatever the
    clocks say (the relay's clock is not Redis's), then by its own time among the receipts.
    """

    def __init__(self, trace: Trace) -> None:
        events = trace.events
        times = [e.t_ms for e in events]  # stream order is commit order: non-decreasing
        slots: dict[int, list[Publish]] = {}
        for p in trace.publishes:
            if p.published_t_ms is None:
                continue
            slot = bisect_right(times, p.published_t_ms) - 1  # the event it goes after
            if p.source is not None:
                slot = max(slot, p.source)
            if p.deliveries:
                slot = min(slot, p.deliveries[0] - 1)
            slots.setdefault(slot, []).append(p)
        def in_order(slot: int) -> list[tuple[int, Event | Publish]]:
            # same instant: rows in outbox order (their commit, then their stream)
            found = sorted(slots.get(slot, []), key=lambda p: (
                p.published_t_ms, -1 if p.source is None else p.source, p.stream_seq))
            return [(p.published_t_ms or 0, p) for p in found]

        points = in_order(-1)
        for i, e in enumerate(events):
            points += [(e.t_ms, e), *in_order(i)]
        self.points: list[tuple[float, int]] = []  # (x, t_ms) of every point, left to right
        self.breaks: list[tuple[float, int]] = []  # (x, gap ms) where long waits were cut
        self.event_x: dict[int, float] = {}
        self.publish_x: dict[int, float] = {}
        x, last = float(_LEFT + 30), None
        for t, point in points:
            if last is not None:
                gap = max(t - last, 0)
                if gap > BREAK_MS:
                    self.breaks.append((x + 40, gap))
                    x += 80
                else:
                    x += 22 + 30 * math.log10(1 + gap)
            last = max(t, last or 0)
            if isinstance(point, Event):
                self.event_x[point.index] = x
            else:
                self.publish_x[point.index] = x
            self.points.append((x, t))

    @property
    def right(self) -> float:
        return self.points[-1][0] if self.points else float(_LEFT)


def _color(e: Event) -> str:
    if "takeover" in e.flags or "refused" in e.flags:
        return "#dc2626"
    if "confirm" in e.flags or "recovery" in e.flags:
        return "#d97706"
    return _COLORS.get(e.kind.split(":")[0], "#374151")


def _svg(trace: Trace) -> str:
    lanes = {lane.id: i for i, lane in enumerate(trace.lanes)}
    axis = _Axis(trace)
    ex = axis.event_x
    width = int(axis.right + _RIGHT + 30)
    height = _TOP + _LANE_H * len(trace.lanes) + 50

    def y(lane_id: str) -> float:
        return _TOP + _LANE_H * lanes[lane_id] + _LANE_H / 2

    out = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           'role="img" font-family="system-ui, sans-serif" font-size="12">',
           '<defs>'
           + "".join(f'<marker id="arrow-{k}" viewBox="0 0 10 10" refX="9" refY="5" '
                     f'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
                     f'<path d="M0,0 L10,5 L0,10 z" fill="{c}"/></marker>'
                     for k, c in _ARROWS)
           + '</defs>']
    for lane in trace.lanes:  # lane bands and labels
        out += _lane(trace, lane.id, lanes[lane.id], width, ex)
    for bx, gap in axis.breaks:
        out.append(f'<g><title>{gap} ms without a receipt or a publish</title>'
                   f'<line x1="{bx}" x2="{bx}" y1="{_TOP - 10}" y2="{height - 40}" '
                   f'stroke="#9ca3af" stroke-dasharray="3 4"/>'
                   f'<text x="{bx}" y="{_TOP - 14}" text-anchor="middle" fill="#6b7280">'
                   f'⋯ {gap / 1000:.2f} s ⋯</text></g>')
    for run in trace.runs:  # attempts as bars on their lane
        for a in run.attempts:
            start = _event_at(trace, a["lane"], a["claimed_ms"])
            end = _event_at(trace, None, a["ended_ms"]) if a["ended_ms"] else None
            if start is None:
                continue
            x1 = ex[start.index]
            x2 = ex[end.index] if end is not None else x1 + 20
            bad = a["result"] in (None, "abandoned")
            color = "#dc2626" if bad else "#10b981"
            t = (f"{run.run_id} attempt {a['attempt']} by {a['worker']}: "
                 + (f"{a['ended_ms'] - a['claimed_ms']} ms, {a['result']}" if a["ended_ms"]
                    else "no result"))
            edge = ' stroke-dasharray="4 3" stroke="#dc2626"' if bad else ""
            out.append(f'<rect x="{x1}" y="{y(a["lane"]) + 8}" width="{max(x2 - x1, 4)}" '
                       f'height="6" rx="3" fill="{color}" opacity="{0.5 if bad else 0.35}"'
                       f'{edge}><title>{escape(t)}</title></rect>')
    relayed = {e.index for e in trace.events
               if e.carrier is not None and e.carrier.publish in axis.publish_x}
    for h in trace.handoffs:  # arrows; a relayed hop is drawn through its publish below
        if h.kind != "takeover" and h.dst in relayed:
            continue
        src, dst = trace.events[h.src], trace.events[h.dst]
        out.append(_arrow(h.kind, ex[src.index], y(src.lane), ex[dst.index], y(dst.lane),
                          h.text))
        if h.kind == "takeover":
            x1, y1, x2 = ex[src.index], y(src.lane), ex[dst.index]
            out.append(f'<text x="{(x1 + x2) / 2}" y="{y1 + 4 - (_LANE_H / 2 - 18)}" '
                       f'text-anchor="middle" fill="#dc2626" font-weight="700">TAKEOVER</text>')
    for p in trace.publishes:  # commit -> publish -> each delivery
        if p.index in axis.publish_x:
            out += _relay_hops(trace, p, axis.publish_x[p.index], y(p.lane), ex, y)
    for e in trace.events:  # event dots, drawn last to sit on top
        out.append(_event_dot(e, ex[e.index], y(e.lane)))
    for p in trace.publishes:
        if p.index in axis.publish_x:
            out.append(_publish_dot(trace, p, axis.publish_x[p.index], y(p.lane)))
    last_label = -1e9
    for x, at_ms in axis.points:  # time axis
        if x - last_label >= 64:
            out.append(f'<text x="{x}" y="{height - 22}" text-anchor="middle" '
                       f'fill="#6b7280" font-size="10">+{at_ms / 1000:.3f}s</text>')
            last_label = x
        out.append(f'<line x1="{x}" x2="{x}" y1="{height - 36}" y2="{height - 32}" '
                   'stroke="#9ca3af"/>')
    out.append("</svg>")
    return "".join(out)


def _lane(trace: Trace, lane_id: str, row: int, width: int, ex: dict[int, float]) -> list[str]:
    """A lane's band and label; a process that fell silent with work in hand is marked."""
    lane = trace.lanes_by_id[lane_id]
    top = _TOP + _LANE_H * row
    died = bool(lane.abandoned) or lane.left_lease is not None  # fell silent with work in hand
    bg = "#fee2e2" if died else _ROLE_BG.get(lane.role, "#f9fafb")
    span = f"+{lane.first_ms / 1000:.3f}s .. +{lane.last_ms / 1000:.3f}s"
    if lane.role == "relay":
        title = (f"relay {lane.name}: published {lane.published} stream message(s) of this "
                 f"session, {span}")
        sub = f"relay · {lane.published} published"
    else:
        title = f"{lane.role} {lane.label}: {lane.events} receipts, {span}"
        sub = f"{lane.role} · pid {lane.pid}{' · DIED?' if died else ''}"
    if lane.abandoned:
        title += "; left " + ", ".join(lane.abandoned) + " without a result (died?)"
    if lane.left_lease is not None:
        title += f"; left the session lease s:{lane.left_lease} unreleased (died?)"
    out = [f'<g class="lane {escape(lane.role)}"><title>{escape(title)}</title>'
           f'<rect x="0" y="{top}" width="{width}" height="{_LANE_H - 4}" fill="{bg}" rx="4"/>'
           f'<text x="10" y="{top + 24}" font-weight="600">{escape(lane.name)}</text>'
           f'<text x="10" y="{top + 42}" fill="#4b5563">{escape(sub)}</text></g>']
    if died:  # where the process went silent
        last = max(ex[e.index] for e in trace.events if e.lane == lane.id)
        out.append(f'<line x1="{last + 8}" x2="{last + 8}" y1="{top + 4}" '
                   f'y2="{top + _LANE_H - 8}" stroke="#dc2626" stroke-width="3">'
                   f'<title>last receipt of {escape(lane.label)}</title></line>'
                   f'<text x="{last + 14}" y="{top + 16}" fill="#dc2626" '
                   f'font-weight="700">✕ silent</text>')
    return out


def _arrow(kind: str, x1: float, y1: float, x2: float, y2: float, title: str,
           cls: str = "handoff") -> str:
    color = dict(_ARROWS).get(kind, "#2563eb")
    bend = (y2 - y1) * 0.3 if y1 != y2 else -36
    dash = {"dispatch": ' stroke-dasharray="6 4"',
            "redelivery": ' stroke-dasharray="5 3"'}.get(kind, "")
    w = {"takeover": 3, "redelivery": 2.5}.get(kind, 1.5)
    return (f'<path class="{cls} {kind}" d="M{x1},{y1} C{x1 + 30},{y1 + bend} '
            f'{x2 - 30},{y2 - bend} {x2 - 7},{y2}" fill="none" stroke="{color}" '
            f'stroke-width="{w}"{dash} marker-end="url(#arrow-{kind})" opacity="0.85">'
            f'<title>{escape(title)}</title></path>')


def _relay_hops(trace: Trace, p: Publish, px: float, py: float, ex: dict[int, float],
                y: Callable[[str], float]) -> list[str]:
    """The segments of one publish: the commit that wrote its row -> the publish, then the
    publish -> every consumer that recorded it (red dashed from the second delivery on)."""
    out = []
    row = f"outbox row {p.row_id or '?'}, stream seq {p.stream_seq}"
    first = trace.events[p.deliveries[0]] if p.deliveries else None
    kind = "wake" if first is not None and trace.lanes_by_id[first.lane].role == "brain" \
        else "dispatch"
    if p.source is not None:
        src = trace.events[p.source]
        wait = f"waited {p.outbox_ms} ms in the outbox" if p.outbox_ms is not None else ""
        out.append(_arrow(kind, ex[src.index], y(src.lane), px, py,
                          f"{src.kind} of {trace.lanes_by_id[src.lane].name} wrote {row}; "
                          f"{wait}, then {p.relay} published it at "
                          f"+{(p.published_t_ms or 0) / 1000:.3f}s", cls="relayed"))
    for i in p.deliveries:
        e = trace.events[i]
        c = e.carrier
        if c is None:
            continue
        redelivery = c.delivery > 1
        took = (f"{c.transit_ms} ms from publish to {c.consumer}"
                if c.transit_ms is not None else "")
        total = (f" ({c.outbox_ms + c.transit_ms} ms from the commit)"
                 if c.outbox_ms is not None and c.transit_ms is not None else "")
        title = (f"{'REDELIVERY: ' if redelivery else ''}{p.relay} -> {c.consumer} "
                 f"{c.action}: {row}, delivery {c.delivery}; "
                 + (f"{c.outbox_ms} ms in the outbox, " if c.outbox_ms is not None else "")
                 + took + total)
        out.append(_arrow("redelivery" if redelivery else kind, px, py, ex[i], y(e.lane),
                          title, cls="relayed"))
        if redelivery:
            out.append(f'<text x="{ex[i] - 10}" y="{y(e.lane) - 22}" text-anchor="end" '
                       f'fill="{_REDELIVERY}" font-size="10" font-weight="700"{_HALO}>'
                       f'redelivery {c.delivery}</text>')
    return out


def _publish_dot(trace: Trace, p: Publish, x: float, y: float) -> str:
    src = trace.events[p.source] if p.source is not None else None
    origin = "a timer" if p.timer else (
        f"{src.kind} of {trace.lanes_by_id[src.lane].name}" if src is not None else
        "a restore request" if row_cause(p.row_id) == "restore" else "?")
    consumers = ", ".join(
        f"{c.consumer} {c.action} (delivery {c.delivery})"
        for c in (trace.events[i].carrier for i in p.deliveries) if c is not None)
    title = (f"+{(p.published_t_ms or 0) / 1000:.3f}s {p.relay} published outbox row "
             f"{p.row_id or '?'} (stream seq {p.stream_seq}) from {origin}"
             + (f", {p.outbox_ms} ms after its commit" if p.outbox_ms is not None else "")
             + f"\ndelivered to: {consumers or 'no consumer recorded it'}")
    label = "/".join(p.row_id.rsplit("/", 2)[1:]) if p.row_id.count("/") >= 2 else ""
    again = len(p.deliveries) > 1
    return (f'<g class="publish"><circle cx="{x}" cy="{y}" r="5.5" fill="{_PUBLISH}" '
            f'stroke="{_REDELIVERY if again else "white"}" stroke-width="{2 if again else 1.5}"/>'
            f'<title>{escape(title)}</title>'
            f'<text x="{x}" y="{y - 11}" text-anchor="middle" font-size="9" fill="#9a3412">'
            f'{escape(label if not p.timer else "timer")}</text>'
            + (f'<text x="{x}" y="{y + 21}" text-anchor="middle" font-size="9" '
               f'fill="{_REDELIVERY}"{_HALO}>{len(p.deliveries)} deliveries</text>'
               if again else "")
            + '</g>')


def _event_dot(e: Event, x: float, y: float) -> str:
    big = bool({"takeover", "refused", "confirm"} & set(e.flags))
    title = (f"+{e.t_ms / 1000:.3f}s {e.kind} fence {e.fence}\n{e.text}"
             + (f"\nmarks: {', '.join(e.marks)}" if e.marks else "")
             + (f"\ncarried by {e.carrier.relay}: outbox row {e.carrier.row_id}, stream "
                f"seq {e.carrier.stream_seq}, delivery {e.carrier.delivery}"
                if e.carrier is not None else "")
             + f"\nreceipt {e.stream_id}")
    shape = (f'<rect x="{x - 7}" y="{y - 7}" width="14" height="14" '
             f'transform="rotate(45 {x} {y})"' if big else
             f'<circle cx="{x}" cy="{y}" r="6"')
    return (f'<g class="event {e.kind.split(":")[0]}">{shape} fill="{_color(e)}" '
            f'stroke="white" stroke-width="1.5"/><title>{escape(title)}</title>'
            f'<text x="{x}" y="{y - 12}" text-anchor="middle" '
            f'font-size="10" fill="#111827">{escape(e.fence)}</text>'
            f'<text x="{x}" y="{y + 26}" text-anchor="middle" '
            f'font-size="9" fill="#374151">{escape(_short_kind(e))}</text></g>')


def _short_kind(e: Event) -> str:
    if "confirm" in e.flags:
        return "confirmed"
    if e.kind == "complete":
        return "done"
    if e.kind == "slot_wait":
        return "slot" if "slot_wait" in e.hops else "waits"
    return e.kind.split(":")[-1]


def _event_at(trace: Trace, lane: str | None, ts_ms: int) -> Event | None:
    for e in trace.events:
        if e.ts_ms == ts_ms and (lane is None or e.lane == lane):
            return e
    return None


_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #111827; }
h1 { font-size: 20px; margin: 0 0 4px; } .sub { color: #4b5563; margin-bottom: 12px; }
.legend span { display: inline-block; margin-right: 18px; }
.legend i { display: inline-block; width: 12px; height: 12px; border-radius: 6px;
  margin-right: 5px; vertical-align: -1px; }
.scroll { overflow-x: auto; border: 1px solid #e5e7eb; border-radius: 6px; margin: 12px 0; }
.alerts li { margin: 3px 0; } .alerts .takeover, .alerts .refused { color: #b91c1c; }
table.attempts { border-collapse: collapse; font-size: 12px; }
table.attempts td, table.attempts th { border: 1px solid #e5e7eb; padding: 2px 6px; }
table.attempts tr.failed td { background: #fef2f2; }
pre { background: #f9fafb; padding: 12px; font-size: 12px; overflow-x: auto; }
.archived { color: #1f2937; background: #e5e7eb; padding: 8px 12px; border-radius: 6px;
  margin: 8px 0; }
.quarantine { color: #fff; background: #b91c1c; padding: 8px 12px; border-radius: 6px;
  margin: 8px 0; font-weight: 600; }
"""


def _model_attempts(trace: Trace) -> str:
    """A table of the model calls: one row per attempt, failed ones included."""
    if not trace.model_attempts:
        return ""
    head = "".join(f"<th>{h}</th>" for h in (
        "t", "request", "status", "outcome", "error", "wait", "tokens in", "tokens out",
        "provider id"))
    rows = "".join(
        f'<tr class="{"failed" if a.error else "ok"}"><td>+{a.t_ms / 1000:.3f}s</td>'
        f"<td>{escape(a.request_id)}</td><td>{escape(a.status)}</td>"
        f"<td>{escape(a.outcome)}</td><td>{escape(a.error)}</td>"
        f"<td>{'' if a.wait_ms is None else f'{a.wait_ms} ms'}</td>"
        f"<td>{a.input_tokens}</td><td>{a.output_tokens}</td>"
        f"<td>{escape(a.provider_request_id)}</td></tr>"
        for a in trace.model_attempts)
    return (f'<h2>Model attempts</h2><table class="attempts"><tr>{head}</tr>{rows}</table>')


def render_html(trace: Trace) -> str:
    """The whole page: heading, legend, the lane picture, the notable events, the text trace."""
    lanes = {lane.id: lane for lane in trace.lanes}
    notable = ("takeover", "refused", "confirm", "recovery", "redelivery", "retry")
    alerts = [f'<li class="{" ".join(e.flags)}">{escape(" + ".join(e.flags).upper())} '
              f'+{e.t_ms / 1000:.3f}s {escape(lanes[e.lane].label)} [{escape(e.fence)}]: '
              f'{escape(e.text)}</li>'
              for e in trace.events if set(e.flags) & set(notable)]
    legend = "".join(f'<span><i style="background:{c}"></i>{escape(k)}</span>' for k, c in (
        ("submit", "#6b7280"), ("lease / commit (Brain)", "#2563eb"),
        ("claim / complete (Hands)", "#059669"), ("slot wait (capped tool)", "#ca8a04"),
        ("confirm / recovery", "#d97706"),
        ("takeover / refused ◆", "#dc2626"), ("relay publish", _PUBLISH)))
    return (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>baton trace {escape(trace.session_id)}</title><style>{_CSS}</style></head>"
        f"<body><h1>Handoff trace: session {escape(trace.session_id)}</h1>"
        f'<div class="sub">{len(trace.events)} receipts · {len(trace.lanes)} processes · '
        f"{trace.duration_ms / 1000:.3f} s · fences: s:N session lease (Brain), a:N tool-run "
        "attempt (Hands) · arrows: commit -> relay publish -> consumer (blue wake, green "
        "dashed dispatch, red dashed redelivery), red takeover · hover anything for details"
        + (" · carried by relays: " + ", ".join(
            f"{escape(name)} ({n})" for name, n in trace.relays.items()) if trace.relays else "")
        + "</div>"
        + (f'<div class="archived">{escape(archived_line(trace.archived_ms))}</div>'
           if trace.archived_ms is not None else "")
        + (f'<div class="quarantine">{escape(quarantine_line(trace.quarantine))}</div>'
           if trace.quarantine else "")
        + f'<div class="legend">{legend}</div>'
        f'<div class="scroll">{_svg(trace)}</div>'
        f'<h2>Takeovers, refusals, recoveries</h2><ul class="alerts">'
        f'{"".join(alerts) or "<li>none</li>"}</ul>'
        + _model_attempts(trace) +
        f"<details open><summary>Text trace</summary><pre>{escape(render_text(trace))}</pre>"
        "</details></body></html>\n"
    )
