"""``baton trace --html``: the handoff timeline as one self-contained HTML page.

A lane per process, the receipts as dots on their lane, attempts as bars from claim to
completion (an attempt that ended without a result is drawn red up to its takeover), and
handoffs as arrows between lanes: wakes, dispatches, and takeovers (red); a wake or
dispatch arrow names the relay that carried its message. Everything has a hover title. No
script, no external fonts, styles or images: the file opens anywhere, and the plain-text
trace is embedded below the picture.

Time runs left to right on a compressed scale: short gaps stay readable next to long
waits, and a gap over :data:`BREAK_MS` is drawn as a break labelled with its length.
"""

from __future__ import annotations

import math
from html import escape

from baton.cli.trace import Event, Trace, render_text

__all__ = ["BREAK_MS", "render_html"]

BREAK_MS = 400
_LEFT, _TOP, _LANE_H, _RIGHT = 230, 70, 64, 40
_COLORS = {
    "submit": "#6b7280", "lease": "#2563eb", "takeover": "#dc2626", "commit": "#1d4ed8",
    "claim": "#059669", "reclaim": "#dc2626", "complete": "#047857", "refused": "#b91c1c",
}
_ROLE_BG = {"brain": "#eef2ff", "hands": "#ecfdf5", "client": "#f3f4f6", "relay": "#fff7ed"}


def _x_positions(events: list[Event]) -> tuple[list[float], list[tuple[float, int]]]:
    """x of each event, and the breaks (x, gap ms) where long waits were cut short."""
    xs: list[float] = []
    breaks: list[tuple[float, int]] = []
    x = float(_LEFT + 30)
    for i, e in enumerate(events):
        if i:
            gap = e.ts_ms - events[i - 1].ts_ms
            if gap > BREAK_MS:
                breaks.append((x + 40, gap))
                x += 80
            else:
                x += 26 + 30 * math.log10(1 + gap)
        xs.append(x)
    return xs, breaks


def _color(e: Event) -> str:
    if "takeover" in e.flags or "refused" in e.flags:
        return "#dc2626"
    if "confirm" in e.flags or "recovery" in e.flags:
        return "#d97706"
    return _COLORS.get(e.kind.split(":")[0], "#374151")


def _svg(trace: Trace) -> str:
    lanes = {lane.id: i for i, lane in enumerate(trace.lanes)}
    xs, breaks = _x_positions(trace.events)
    width = int((xs[-1] if xs else _LEFT) + _RIGHT + 60)
    height = _TOP + _LANE_H * len(trace.lanes) + 50

    def y(lane_id: str) -> float:
        return _TOP + _LANE_H * lanes[lane_id] + _LANE_H / 2

    out = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           'role="img" font-family="system-ui, sans-serif" font-size="12">',
           '<defs>'
           + "".join(f'<marker id="arrow-{k}" viewBox="0 0 10 10" refX="9" refY="5" '
                     f'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
                     f'<path d="M0,0 L10,5 L0,10 z" fill="{c}"/></marker>'
                     for k, c in (("wake", "#2563eb"), ("dispatch", "#059669"),
                                  ("takeover", "#dc2626")))
           + '</defs>']
    for lane in trace.lanes:  # lane bands and labels
        top = _TOP + _LANE_H * lanes[lane.id]
        bg = "#fee2e2" if lane.abandoned else _ROLE_BG.get(lane.role, "#f9fafb")
        title = (f"{lane.role} {lane.label}: {lane.events} receipts, "
                 f"+{lane.first_ms / 1000:.3f}s .. +{lane.last_ms / 1000:.3f}s")
        if lane.abandoned:
            title += "; left " + ", ".join(lane.abandoned) + " without a result (died?)"
        out.append(f'<g class="lane"><title>{escape(title)}</title>'
                   f'<rect x="0" y="{top}" width="{width}" height="{_LANE_H - 4}" '
                   f'fill="{bg}" rx="4"/>'
                   f'<text x="10" y="{top + 24}" font-weight="600">{escape(lane.name)}</text>'
                   f'<text x="10" y="{top + 42}" fill="#4b5563">{escape(lane.role)} · pid '
                   f'{lane.pid}{" · DIED?" if lane.abandoned else ""}</text></g>')
        if lane.abandoned:  # where the process went silent
            last = max(x for x, e in zip(xs, trace.events, strict=True) if e.lane == lane.id)
            out.append(f'<line x1="{last + 8}" x2="{last + 8}" y1="{top + 4}" '
                       f'y2="{top + _LANE_H - 8}" stroke="#dc2626" stroke-width="3">'
                       f'<title>last receipt of {escape(lane.label)}</title></line>'
                       f'<text x="{last + 14}" y="{top + 16}" fill="#dc2626" '
                       f'font-weight="700">✕ silent</text>')
    for bx, gap in breaks:
        out.append(f'<g><title>{gap} ms without a receipt</title>'
                   f'<line x1="{bx}" x2="{bx}" y1="{_TOP - 10}" y2="{height - 40}" '
                   f'stroke="#9ca3af" stroke-dasharray="3 4"/>'
                   f'<text x="{bx}" y="{_TOP - 14}" text-anchor="middle" fill="#6b7280">'
                   f'⋯ {gap / 1000:.2f} s ⋯</text></g>')
    index = {e.index: i for i, e in enumerate(trace.events)}
    for run in trace.runs:  # attempts as bars on their lane
        for a in run.attempts:
            start = _event_at(trace, a["lane"], a["claimed_ms"])
            end = _event_at(trace, None, a["ended_ms"]) if a["ended_ms"] else None
            if start is None:
                continue
            x1 = xs[index[start.index]]
            x2 = xs[index[end.index]] if end is not None else x1 + 20
            bad = a["result"] in (None, "abandoned")
            color = "#dc2626" if bad else "#10b981"
            t = (f"{run.run_id} attempt {a['attempt']} by {a['worker']}: "
                 + (f"{a['ended_ms'] - a['claimed_ms']} ms, {a['result']}" if a["ended_ms"]
                    else "no result"))
            edge = ' stroke-dasharray="4 3" stroke="#dc2626"' if bad else ""
            out.append(f'<rect x="{x1}" y="{y(a["lane"]) + 8}" width="{max(x2 - x1, 4)}" '
                       f'height="6" rx="3" fill="{color}" opacity="{0.5 if bad else 0.35}"'
                       f'{edge}><title>{escape(t)}</title></rect>')
    for h in trace.handoffs:  # arrows
        src, dst = trace.events[h.src], trace.events[h.dst]
        x1, y1, x2, y2 = xs[index[src.index]], y(src.lane), xs[index[dst.index]], y(dst.lane)
        color = {"takeover": "#dc2626", "dispatch": "#059669"}.get(h.kind, "#2563eb")
        bend = (y2 - y1) * 0.3 if y1 != y2 else -36
        dash = ' stroke-dasharray="6 4"' if h.kind == "dispatch" else ""
        w = 3 if h.kind == "takeover" else 1.5
        out.append(f'<path class="handoff {h.kind}" d="M{x1},{y1} C{x1 + 30},{y1 + bend} '
                   f'{x2 - 30},{y2 - bend} {x2 - 7},{y2}" fill="none" stroke="{color}" '
                   f'stroke-width="{w}"{dash} marker-end="url(#arrow-{h.kind})" opacity="0.85">'
                   f'<title>{escape(h.text)}</title></path>')
        if h.kind == "takeover":
            out.append(f'<text x="{(x1 + x2) / 2}" y="{y1 + 4 - (_LANE_H / 2 - 18)}" '
                       f'text-anchor="middle" fill="#dc2626" font-weight="700">TAKEOVER</text>')
    for i, e in enumerate(trace.events):  # event dots, drawn last to sit on top
        big = bool({"takeover", "refused", "confirm"} & set(e.flags))
        title = (f"+{e.t_ms / 1000:.3f}s {e.kind} fence {e.fence}\n{e.text}"
                 + (f"\nmarks: {', '.join(e.marks)}" if e.marks else "")
                 + (f"\ncarried by {e.carrier.relay}: outbox row {e.carrier.row_id}, stream "
                    f"seq {e.carrier.stream_seq}, delivery {e.carrier.delivery}"
                    if e.carrier is not None else "")
                 + f"\nreceipt {e.stream_id}")
        shape = (f'<rect x="{xs[i] - 7}" y="{y(e.lane) - 7}" width="14" height="14" '
                 f'transform="rotate(45 {xs[i]} {y(e.lane)})"' if big else
                 f'<circle cx="{xs[i]}" cy="{y(e.lane)}" r="6"')
        out.append(f'<g class="event {e.kind.split(":")[0]}">{shape} fill="{_color(e)}" '
                   f'stroke="white" stroke-width="1.5"/><title>{escape(title)}</title>'
                   f'<text x="{xs[i]}" y="{y(e.lane) - 12}" text-anchor="middle" '
                   f'font-size="10" fill="#111827">{escape(e.fence)}</text>'
                   f'<text x="{xs[i]}" y="{y(e.lane) + 26}" text-anchor="middle" '
                   f'font-size="9" fill="#374151">{escape(_short_kind(e))}</text></g>')
    last_label = -1e9
    for i, e in enumerate(trace.events):  # time axis
        if xs[i] - last_label >= 64:
            out.append(f'<text x="{xs[i]}" y="{height - 22}" text-anchor="middle" '
                       f'fill="#6b7280" font-size="10">+{e.t_ms / 1000:.3f}s</text>')
            last_label = xs[i]
        out.append(f'<line x1="{xs[i]}" x2="{xs[i]}" y1="{height - 36}" y2="{height - 32}" '
                   'stroke="#9ca3af"/>')
    out.append("</svg>")
    return "".join(out)


def _short_kind(e: Event) -> str:
    if "confirm" in e.flags:
        return "confirmed"
    if e.kind == "complete":
        return "done"
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
pre { background: #f9fafb; padding: 12px; font-size: 12px; overflow-x: auto; }
"""


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
        ("claim / complete (Hands)", "#059669"), ("confirm / recovery", "#d97706"),
        ("takeover / refused ◆", "#dc2626")))
    return (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>baton trace {escape(trace.session_id)}</title><style>{_CSS}</style></head>"
        f"<body><h1>Handoff trace: session {escape(trace.session_id)}</h1>"
        f'<div class="sub">{len(trace.events)} receipts · {len(trace.lanes)} processes · '
        f"{trace.duration_ms / 1000:.3f} s · fences: s:N session lease (Brain), a:N tool-run "
        "attempt (Hands) · arrows: blue wake, green dashed dispatch, red takeover · "
        "hover anything for details"
        + (" · carried by relays: " + ", ".join(
            f"{escape(name)} ({n})" for name, n in trace.relays.items()) if trace.relays else "")
        + "</div>"
        f'<div class="legend">{legend}</div>'
        f'<div class="scroll">{_svg(trace)}</div>'
        f'<h2>Takeovers, refusals, recoveries</h2><ul class="alerts">'
        f'{"".join(alerts) or "<li>none</li>"}</ul>'
        f"<details open><summary>Text trace</summary><pre>{escape(render_text(trace))}</pre>"
        "</details></body></html>\n"
    )
