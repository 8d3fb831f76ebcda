"""Regenerate the README's Status table from ``summary.json`` (``make bench`` runs this).

``python -m baton.bench.readme [--readme README.md] [--command "make bench"]`` replaces what
stands between the ``<!-- status:begin -->`` and ``<!-- status:end -->`` markers with the
figures of the last run: the ratios to the baselines measured in the same run first (they hold
on any machine), then the absolute figures, with the command, the machine and the load beside
them. Nothing in the table is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from baton.bench.common import RESULTS_DIR

__all__ = ["render", "replace_block"]

BEGIN, END = "<!-- status:begin -->", "<!-- status:end -->"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def _met(row: dict[str, Any]) -> str:
    return "" if not row["target"] else "yes" if row["met"] else "no"


def render(summary: dict[str, Any], command: str) -> str:
    env = summary.get("env", {})
    rows = summary["targets"]
    first = [r for r in rows if r.get("ratio_value") is not None]
    rest = [r for r in rows if r.get("ratio_value") is None]
    load, cpus = env.get("loadavg_1m", float("nan")), env.get("cpus") or 1
    shared = (" (a loaded machine: the absolute figures are pessimistic)"
              if isinstance(cpus, int) and load > cpus / 2 else "")
    lines = [
        f"Measured by `{command}` on {env.get('cpus', '?')} CPUs ({env.get('platform', '?')}, "
        f"Python {env.get('python', '?')}), {env.get('time', '?')}, load average "
        f"{load:.1f} as it started{shared}; the ratios are to baselines "
        f"measured in the same run (the raw Redis/NATS hop chain, a plain in-process loop "
        f"doing the same work with a JSONL log, and the same work as an in-process LangGraph "
        f"agent checkpointing to SQLite, when installed).",
        "",
        "| figure | measured | target | met |",
        "|---|---:|---:|:---:|",
    ]
    for r in first + rest:
        lines.append(f"| {_cell(r['figure'])} | {_cell(r['measured'])} | "
                     f"{_cell(r['target'])} | {_met(r)} |")
    lines += ["", *(f"Not in this run: {line}." for line in summary.get("skipped", []))]
    return "\n".join(lines).rstrip("\n") + "\n"


def replace_block(text: str, block: str) -> str:
    try:
        head, rest = text.split(BEGIN, 1)
        _old, tail = rest.split(END, 1)
    except ValueError:
        raise SystemExit(f"the README has no {BEGIN} ... {END} block") from None
    return f"{head}{BEGIN}\n{block}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m baton.bench.readme", description=__doc__)
    parser.add_argument("--readme", type=Path, default=Path("README.md"))
    parser.add_argument("--results", type=Path, default=RESULTS_DIR)
    parser.add_argument("--command", default="make bench")
    args = parser.parse_args(argv)
    path = args.results / "summary.json"
    if not path.exists():
        print(f"no {path}: run the benchmarks first", file=sys.stderr)
        return 1
    summary = json.loads(path.read_text())
    args.readme.write_text(replace_block(args.readme.read_text(), render(summary, args.command)))
    print(f"updated the Status table of {args.readme} from {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
