"""One page for one run: every figure beside its target, as a table, JSON and an SVG picture.

Reads what the benchmarks wrote to ``bench/results/`` (``e2e``, ``durable``, ``takeover``,
``history``, ``cold``), prints the targets table, and writes ``summary.json`` and ``bench.svg``
there. The run on durable servers (``durable``) gives the same targets as ``e2e``, each named
as measured on durable servers. A figure from a result the command did not measure (an
earlier run's file) says when it was measured. The picture is
plain SVG written here (no plotting dependency): sessions/s and latency by concurrency with
one and two brains/hands, the takeover trials, and the step cost by history length.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape as rich_escape
from rich.table import Table

from baton.bench.common import RESULTS_DIR

__all__ = ["summarize"]

_COLORS = ("#3b6ea8", "#e07b39", "#5a9e5a", "#9b59b6", "#7f8c8d")


def _load(directory: Path, name: str) -> dict[str, Any] | None:
    path = directory / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


#: How the figures of the run on durable servers are named (before e2e's own names).
DURABLE_PREFIX = "on durable servers (every write fsync'd, baselines too): "


def e2e_targets(e2e: dict[str, Any], prefix: str = "") -> list[dict[str, Any]]:
    """The targets an e2e run (or the run on durable servers) printed, ``prefix`` before
    each figure's name, and its scale-out pass's share of the plain loop when it made one."""
    out = [{"figure": prefix + t["figure"], "measured": t["measured"], "target": t["target"],
            "ratio_value": t.get("ratio_value"), "met": t["met"],
            **({"higher_is_better": True} if t.get("higher_is_better") else {})}
           for t in e2e.get("targets", [])]
    scaled = e2e.get("sessions_scaled", {}).get("c=32")
    plain = e2e.get("plain_loop", {}).get("c=32")
    if scaled and plain:
        share = scaled["sessions_per_s"] / plain["sessions_per_s"]
        out.append({"figure": prefix + "five notices sessions/s at concurrency 32, 2 brains + "
                              "2 hands / plain loop",
                    "measured": f"{share:.0%} ({scaled['sessions_per_s']:.0f} vs "
                                f"{plain['sessions_per_s']:.0f}/s)",
                    "target": ">= 40%", "ratio_value": share, "met": share >= 0.40})
    return out


def durable_targets(durable: dict[str, Any]) -> list[dict[str, Any]]:
    return e2e_targets(durable, DURABLE_PREFIX)


def takeover_targets(takeover: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"figure": f"takeover median ({v['variant']}: tool_ack_wait "
                       f"{v['ack_wait_s']:g}s, ttl {v['attempt_ttl_ms']} ms)",
             "measured": f"{v['median_s']:.2f}s (p90 {v['p90_s']:.2f}s, "
                         f"{len(v['trials'])} kills, "
                         f"{v.get('duplicates', '?')} duplicates, "
                         f"{v.get('resends', '?')} re-sends)",
             "target": f"<= {takeover['target_median_s']}s",
             "met": v["median_s"] <= takeover["target_median_s"]
             and not v.get("duplicates") and not v.get("resends")}
            for v in takeover["variants"]]


def history_targets(history: dict[str, Any]) -> list[dict[str, Any]]:
    rows = _held(history)
    return [{"figure": f"Brain step at {rows[-1]['operation'].split(', ')[-1]} vs "
                       f"{rows[0]['operation'].split(', ')[-1]}, entries held",
             "measured": f"{history['ratio_last_to_first']:.2f}x "
                         f"({rows[-1]['p50_us']:.0f} vs {rows[0]['p50_us']:.0f} µs)",
             "target": f"<= {history['target_ratio']}x",
             "met": history["ratio_last_to_first"] <= history["target_ratio"]}]


def _held(history: dict[str, Any]) -> list[dict[str, Any]]:
    """The history rows with the entries held (the Brain's own case); all rows for results
    written before the bench measured both."""
    return [r for r in history["rows"] if r["mode"] == "held"] or history["rows"]


# ---------------------------------------------------------------------------- SVG


class _Panel:
    """One chart: a frame, a y axis from 0 to ``top``, grouped bars, lines and labels."""

    W, H, PAD = 440, 260, 46
    LEGEND_COLUMNS, LEGEND_ROW = 3, 13

    def __init__(self, x: int, y: int, title: str, top: float, unit: str,
                 series: int = 1) -> None:
        self.x, self.y, self.top, self.unit = x, y, top or 1.0, unit
        # the legend's rows under the title, above the plot (never over a bar)
        self.legend_rows = math.ceil(series / self.LEGEND_COLUMNS) if series > 1 else 0
        self.parts = [f'<text x="{x + 8}" y="{y + 18}" font-weight="bold">{escape(title)}'
                      f"</text>"]
        for k in range(5):
            v = self.top * k / 4
            yy = self._y(v)
            self.parts.append(f'<line x1="{x + self.PAD}" x2="{x + self.W - 10}" y1="{yy:.1f}" '
                              f'y2="{yy:.1f}" stroke="#ddd"/><text x="{x + self.PAD - 4}" '
                              f'y="{yy + 4:.1f}" text-anchor="end" font-size="10">'
                              f"{v:,.{0 if self.top >= 10 else 1}f}</text>")
        self.parts.append(f'<text x="{x + 6}" y="{self._y(self.top) - 8:.1f}" font-size="10">'
                          f'{escape(unit)}</text>')

    def _y(self, v: float) -> float:
        legend = self.LEGEND_ROW * self.legend_rows
        bottom, height = self.y + self.H - 30, self.H - 70 - legend
        return bottom - height * min(max(v, 0.0), self.top) / self.top

    def bars(self, groups: list[str], series: dict[str, list[float]]) -> None:
        width = (self.W - self.PAD - 20) / max(len(groups), 1)
        bar = width * 0.8 / max(len(series), 1)
        every = max(1, math.ceil(len(groups) / 12))  # at most 12 group labels, never overlapping
        labelled = bar >= 14  # a value over each bar only where it fits
        for g, label in enumerate(groups):
            gx = self.x + self.PAD + 6 + g * width
            if g % every == 0:
                self.parts.append(f'<text x="{gx + width * 0.4:.1f}" y="{self.y + self.H - 14}" '
                                  f'text-anchor="middle" font-size="11">{escape(label)}</text>')
            for s, (_name, values) in enumerate(series.items()):
                v = values[g] if g < len(values) else math.nan
                if math.isnan(v):
                    continue
                top = self._y(v)
                bx = gx + s * bar
                self.parts.append(
                    f'<rect x="{bx:.1f}" y="{top:.1f}" width="{bar - 2:.1f}" '
                    f'height="{self._y(0) - top:.1f}" fill="{_COLORS[s % len(_COLORS)]}"/>')
                if labelled:
                    self.parts.append(
                        f'<text x="{bx + bar / 2:.1f}" y="{top - 3:.1f}" text-anchor="middle" '
                        f'font-size="9">{v:,.{0 if v >= 10 else 2}f}</text>')
        if len(series) < 2:
            return
        column = (self.W - 16) / self.LEGEND_COLUMNS
        for s, name in enumerate(series):
            row, col = divmod(s, self.LEGEND_COLUMNS)
            lx = self.x + 8 + col * column
            ly = self.y + 34 + self.LEGEND_ROW * row
            self.parts.append(f'<rect x="{lx:.1f}" y="{ly - 9}" width="10" height="10" '
                              f'fill="{_COLORS[s % len(_COLORS)]}"/><text x="{lx + 14:.1f}" '
                              f'y="{ly}" font-size="10">{escape(name)}</text>')

    def target(self, value: float, label: str) -> None:
        yy = self._y(value)
        self.parts.append(f'<line x1="{self.x + self.PAD}" x2="{self.x + self.W - 10}" '
                          f'y1="{yy:.1f}" y2="{yy:.1f}" stroke="#c0392b" stroke-dasharray="5,3"/>'
                          f'<text x="{self.x + self.PAD + 4}" y="{yy - 4:.1f}" font-size="10" '
                          f'fill="#c0392b">{escape(label)}</text>')

    def svg(self) -> str:
        return "".join(self.parts)


def render_svg(e2e: dict[str, Any] | None, takeover: dict[str, Any] | None,
               history: dict[str, Any] | None, rows: list[dict[str, Any]]) -> str:
    panels: list[_Panel] = []
    if e2e:
        one = e2e.get("sessions", {})
        two = e2e.get("sessions_scaled", {})
        levels = list(one)
        rate = {"1 brain + 1 hands": [one[k]["sessions_per_s"] for k in levels]}
        if two:
            rate["2 brains + 2 hands"] = [two.get(k, {}).get("sessions_per_s", math.nan)
                                          for k in levels]
        plain = e2e.get("plain_loop", {})
        if plain:
            rate["plain in-process loop"] = [plain.get(k, {}).get("sessions_per_s", math.nan)
                                             for k in levels]
        peer = {k: v for k, v in e2e.get("langgraph", {}).items() if k.startswith("c=")}
        if peer:
            rate["LangGraph in-process"] = [peer.get(k, {}).get("sessions_per_s", math.nan)
                                            for k in levels]
        top = max([1.0, *[v for vs in rate.values() for v in vs if not math.isnan(v)]]) * 1.15
        p = _Panel(0, 0, "Five-notice sessions/s by concurrency", top, "sessions/s",
                   len(rate))
        p.bars(levels, rate)
        if "c=32" in plain:
            p.target(0.4 * plain["c=32"]["sessions_per_s"], "target >= 40% of the plain loop, c=32")
        panels.append(p)
        lat: dict[str, list[float]] = {}
        for name, per in (("p50, 1+1", one), ("p99, 1+1", one), ("p50, 2+2", two)):
            if per:
                key = "p50_ms" if name.startswith("p50") else "p99_ms"
                lat[name] = [per.get(k, {}).get(key, math.nan) for k in levels]
        if plain:
            lat["p50, plain loop"] = [plain.get(k, {}).get("p50_ms", math.nan) for k in levels]
        if peer:
            lat["p50, LangGraph"] = [peer.get(k, {}).get("p50_ms", math.nan) for k in levels]
        top = max([1.0, *[v for vs in lat.values() for v in vs if not math.isnan(v)]]) * 1.15
        p = _Panel(460, 0, "Latency submit -> settled (ms)", top, "ms", len(lat))
        p.bars(levels, lat)
        if "c=1" in plain:
            p.target(2.5 * plain["c=1"]["p50_ms"], "target p50 <= 2.5x the plain loop, c=1")
        panels.append(p)
    if takeover:
        variants = takeover["variants"]
        n = max(len(v["trials"]) for v in variants)
        series = {v["variant"]: [t["done_s"] for t in v["trials"]] for v in variants}
        top = max([2.0, *[x for xs in series.values() for x in xs]]) * 1.15
        p = _Panel(0, 280, "Takeover: SIGKILL mid-send -> session done (s)", top, "s",
                   len(series))
        p.bars([f"#{i + 1}" for i in range(n)], series)
        p.target(takeover["target_median_s"], f"target median <= {takeover['target_median_s']}s")
        panels.append(p)
    if history:
        labels = [r["operation"].split(", ")[-1].replace(" entries", "") for r in
                  _held(history)]
        values = [r["p50_us"] for r in _held(history)]
        p = _Panel(460, 280, "Brain step (acquire+load, commit) by history", max(values) * 1.3,
                   "µs, p50")
        p.bars(labels, {"p50 µs": values})
        p.target(values[0] * history["target_ratio"], f"{history['target_ratio']}x the step at "
                                                      f"{labels[0]}")
        panels.append(p)
    # each figure in lines of the picture's width (about 150 characters at this size)
    lines = [(r, part) for r in rows for part in textwrap.wrap(
        f"{'met' if r['met'] else 'MISSED'}: {r['figure']}: {r['measured']} "
        f"(target {r['target']})" if r["target"] else f"{r['figure']}: {r['measured']}",
        150, subsequent_indent="    ")]
    text = "".join(f'<text x="8" y="{580 + 15 * i}" font-size="11" fill="'
                   f'{_line_color(r)}">{escape(line)}</text>'
                   for i, (r, line) in enumerate(lines))
    height = 590 + 15 * len(lines)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="920" height="{height}" '
            f'font-family="sans-serif" font-size="12"><rect width="100%" height="100%" '
            f'fill="white"/>{"".join(p.svg() for p in panels)}{text}</svg>\n')


def cold_targets(cold: dict[str, Any]) -> list[dict[str, Any]]:
    t = cold["targets"]
    imp = cold["import_cpu_s"]["baton"]
    workers = {k: v for k, v in cold["import_cpu_s"].items() if k.endswith(".worker")}
    slowest = max(workers.values()) if workers else math.nan
    return [
        {"figure": "import baton (CPU)", "measured": f"{imp * 1000:.0f} ms",
         "target": f"< {t['import_s'] * 1000:.0f} ms", "met": imp < t["import_s"]},
        {"figure": "import of the slowest worker entry point (CPU)",
         "measured": f"{slowest * 1000:.0f} ms", "target": "", "met": True},
        {"figure": "a Hands spawned into a running stack -> serving (wall; its own CPU)",
         "measured": f"{cold['worker_ready_s']:.2f} s ({cold.get('worker_ready_cpu_s', 0):.2f} s"
                     f" CPU)", "target": f"< {t['ready_s']} s",
         "met": cold["worker_ready_s"] < t["ready_s"]},
        {"figure": "idle stack CPU (Redis, NATS, Brain, 2 Hands, Relay)",
         "measured": f"{cold['idle_cpu_total_ms_per_s']:.1f} ms/s" + _floor(cold),
         "target": f"<= {t['idle_ms_per_s']} ms/s",
         "met": cold["idle_cpu_total_ms_per_s"] <= t["idle_ms_per_s"],
         **({"ratio_value": cold["idle_cpu_total_ms_per_s"] / cold["idle_floor_total_ms_per_s"]}
            if cold.get("idle_floor_total_ms_per_s") else {})},
    ]


def _floor(cold: dict[str, Any]) -> str:
    """The idle stack beside its floor measured in the same seconds (bench cold)."""
    floor = cold.get("idle_floor_total_ms_per_s")
    if not floor:
        return ""
    wakes = sum(cold.get("idle_wakes_per_s", {}).values())
    return (f" = {cold['idle_cpu_total_ms_per_s'] / floor:.2f}x its floor ({floor:.1f} ms/s: "
            f"the servers without clients and a bare process per worker waking once a "
            f"second); {wakes:.0f} wakes/s")


def ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The machine-independent figures (ratios to baselines of the same run), by figure."""
    return {r["figure"]: float(r["ratio_value"]) for r in rows
            if r.get("ratio_value") is not None}


def _line_color(row: dict[str, Any]) -> str:
    """Green for a target met, red for one missed, grey for a figure without a target."""
    return "#555" if not row["target"] else "#2e7d32" if row["met"] else "#c0392b"


def skipped(e2e: dict[str, Any] | None) -> list[str]:
    """What the run left out, in words (the LangGraph peer when it was not installed)."""
    hint = (e2e or {}).get("langgraph", {}).get("skipped")
    return [f"the in-process LangGraph peer was not measured: {hint}"] if hint else []


#: The result files the summary reads, in the table's order, and the targets of each.
SOURCES: tuple[tuple[str, Callable[[dict[str, Any]], list[dict[str, Any]]]], ...] = (
    ("e2e", e2e_targets), ("durable", durable_targets), ("takeover", takeover_targets),
    ("history", history_targets), ("cold", cold_targets))


def _dated(result: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` of a result the command did not measure, each saying when it was."""
    when = result.get("env", {}).get("time", "?")
    return [{**r, "measured": f"{r['measured']} [an earlier run: {when}]"} for r in rows]


def summarize(console: Console, directory: Path = RESULTS_DIR,
              ran: set[str] | None = None) -> dict[str, Any]:
    """Print the targets table; write ``summary.json`` and ``bench.svg``. ``ran``: the
    benchmarks this command ran (None: every file is taken as fresh); a figure of another
    one's file (an earlier run) says when it was measured."""
    results = {name: _load(directory, name) for name, _ in SOURCES}
    rows: list[dict[str, Any]] = []
    for name, targets_of in SOURCES:
        result = results[name]
        if result:
            mine = targets_of(result)
            rows += mine if ran is None or name in ran else _dated(result, mine)
    e2e, takeover, history = results["e2e"], results["takeover"], results["history"]
    table = Table(title="Every figure beside its target", title_justify="left")
    for col in ("figure", "measured", "target", "met"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["figure"], r["measured"], r["target"],
                      "" if not r["target"] else "yes" if r["met"] else "[red]no[/red]")
    console.print(table)
    directory.mkdir(parents=True, exist_ok=True)
    env: dict[str, Any] = next((r["env"] for r in (e2e, takeover, history) if r), {})
    left_out = skipped(e2e)
    for line in left_out:
        console.print(f"[yellow]{rich_escape(line)}[/yellow]")
    summary = {"targets": rows, "ratios": ratios(rows), "env": env, "skipped": left_out}
    (directory / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    picture = directory / "bench.svg"
    picture.write_text(render_svg(e2e, takeover, history, rows))
    console.print(f"picture: {picture} (open it in a browser); figures: "
                  f"{directory / 'summary.json'}")
    return summary
