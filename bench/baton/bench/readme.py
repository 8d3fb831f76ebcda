"""Regenerate the benchmark tables from ``summary.json`` (``make bench`` runs this).

``python -m baton.bench.readme [--docs docs/benchmarks.md] [--readme README.md]
[--command "make bench"]`` replaces what stands between the ``<!-- status:begin -->`` and
``<!-- status:end -->`` markers of two files with the figures of the last run:

- docs/benchmarks.md gets the full table: the ratios to the baselines measured in the same run
  first (they hold on any machine), then the absolute figures; the rows measured on servers
  that fsync every write in a table of their own;
- the README gets the headline figures only (:data:`HEADLINE`), each a ratio to a baseline of
  the same run, and a link to the full table.

Both name the command, the machine and its load. Nothing in either table is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from baton.bench.common import RESULTS_DIR

__all__ = ["HEADLINE", "render", "render_headline", "replace_block"]

BEGIN, END = "<!-- status:begin -->", "<!-- status:end -->"

#: The rows of ``summary.json`` that measure the same sessions on durable servers start so.
DURABLE = "on durable servers (every write fsync'd, baselines too): "

#: The README's figures, by the start of their name in ``summary.json``, in this order.
HEADLINE = (
    "five notices sessions/s at concurrency 32 / in-process LangGraph's",
    "CPU per step at concurrency 32, Baton's processes and its client / in-process LangGraph's",
    "five notices p50 at concurrency 1 / in-process LangGraph's",
    "five notices sessions/s at concurrency 32 / plain loop",
    "five notices p50 at concurrency 1 / plain loop p50",
    "takeover median",
)

#: Where the README's headline block points for the rest.
FULL_TABLE = "docs/benchmarks.md"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def _met(row: dict[str, Any]) -> str:
    return "" if not row["target"] else "yes" if row["met"] else "no"


def _measured_by(summary: dict[str, Any], command: str) -> str:
    env = summary.get("env", {})
    load, cpus = env.get("loadavg_1m", float("nan")), env.get("cpus") or 1
    shared = (" (a loaded machine: the absolute figures are pessimistic)"
              if isinstance(cpus, int) and load > cpus / 2 else "")
    return (f"Measured by `{command}` on {env.get('cpus', '?')} CPUs "
            f"({env.get('platform', '?')}, Python {env.get('python', '?')}), "
            f"{env.get('time', '?')}, load average {load:.1f} as it started{shared}")


def _table(rows: list[dict[str, Any]], strip: str = "") -> list[str]:
    first = [r for r in rows if r.get("ratio_value") is not None]
    rest = [r for r in rows if r.get("ratio_value") is None]
    lines = ["| figure | measured | target | met |", "|---|---:|---:|:---:|"]
    for r in first + rest:
        lines.append(f"| {_cell(r['figure'].removeprefix(strip))} | {_cell(r['measured'])} | "
                     f"{_cell(r['target'])} | {_met(r)} |")
    return lines


def render(summary: dict[str, Any], command: str) -> str:
    """The full table of docs/benchmarks.md."""
    rows = summary["targets"]
    plain = [r for r in rows if not r["figure"].startswith(DURABLE)]
    durable = [r for r in rows if r["figure"].startswith(DURABLE)]
    lines = [
        f"{_measured_by(summary, command)}; the ratios are to baselines measured in the same "
        f"run (the raw Redis/NATS hop chain, a plain in-process loop doing the same work with "
        f"a JSONL log, and the same work as an in-process LangGraph agent checkpointing to "
        f"SQLite, when installed).",
        "",
        *_table(plain),
    ]
    if durable:
        lines += ["", f"The same sessions {DURABLE.removesuffix(': ')}:", "",
                  *_table(durable, strip=DURABLE)]
    lines += ["", *(f"Not in this run: {line}." for line in summary.get("skipped", []))]
    return "\n".join(lines).rstrip("\n") + "\n"


def render_headline(summary: dict[str, Any], command: str) -> str:
    """The README's few figures, each beside its target, and where the rest are: rows of the
    full table, in :data:`HEADLINE`'s order (the ratios first)."""
    rows = summary["targets"]
    found = {name: [r for r in rows if r["figure"].startswith(name)] for name in HEADLINE}
    picked = [matches[0] for matches in found.values() if matches]
    lines = [
        f"{_measured_by(summary, command)}; each ratio is to a baseline measured in the same "
        f"run. Every figure, the baselines and the method: [{FULL_TABLE}]({FULL_TABLE}).",
        "",
        *_table(picked),
    ]
    lines += ["", *(f"Not in this run: {name}." for name, matches in found.items()
                    if not matches)]
    return "\n".join(lines).rstrip("\n") + "\n"


def replace_block(text: str, block: str) -> str:
    try:
        head, rest = text.split(BEGIN, 1)
        _old, tail = rest.split(END, 1)
    except ValueError:
        raise SystemExit(f"no {BEGIN} ... {END} block to replace") from None
    return f"{head}{BEGIN}\n{block}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m baton.bench.readme", description=__doc__)
    parser.add_argument("--docs", type=Path, default=Path(FULL_TABLE))
    parser.add_argument("--readme", type=Path, default=Path("README.md"))
    parser.add_argument("--results", type=Path, default=RESULTS_DIR)
    parser.add_argument("--command", default="make bench")
    args = parser.parse_args(argv)
    path = args.results / "summary.json"
    if not path.exists():
        print(f"no {path}: run the benchmarks first", file=sys.stderr)
        return 1
    summary = json.loads(path.read_text())
    for target, block in ((args.docs, render(summary, args.command)),
                          (args.readme, render_headline(summary, args.command))):
        target.write_text(replace_block(target.read_text(), block))
        print(f"updated the benchmark table of {target} from {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
