"""Bench regression check: compare the ratios of two runs, never their absolute times.

``python -m baton.bench.check BASELINE.json [CURRENT.json] [--tolerance 0.25]`` reads the
``ratios`` of two ``summary.json`` files (each figure divided by a baseline measured in the
same run, so a slower or busier machine moves both sides alike) and fails (exit 1) when a
ratio got worse by more than the tolerance (lower for a figure whose target reads ``>=``, or
that says ``higher_is_better``, a figure without a target; higher for the others), or when a
figure of the baseline was not measured this time (a peer not installed, a benchmark not run).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from baton.bench.common import RESULTS_DIR

__all__ = ["regressions"]


def _ratios(summary: dict[str, Any]) -> dict[str, tuple[float, bool]]:
    """figure -> (ratio, higher is better)."""
    return {r["figure"]: (float(r["ratio_value"]),
                          bool(r.get("higher_is_better", str(r["target"]).startswith(">="))))
            for r in summary.get("targets", []) if r.get("ratio_value") is not None}


def regressions(baseline: dict[str, Any], current: dict[str, Any],
                tolerance: float) -> list[str]:
    old, new = _ratios(baseline), _ratios(current)
    out = [f"{figure}: {value:.3g} -> not measured" for figure, (value, _) in old.items()
           if figure not in new]
    for figure, (value, higher) in new.items():
        if figure not in old:
            continue
        before = old[figure][0]
        worse = value < before * (1 - tolerance) if higher else value > before * (1 + tolerance)
        if worse:
            out.append(f"{figure}: {before:.3g} -> {value:.3g}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m baton.bench.check", description=__doc__)
    parser.add_argument("baseline", type=Path)
    parser.add_argument("current", type=Path, nargs="?", default=RESULTS_DIR / "summary.json")
    parser.add_argument("--tolerance", type=float, default=0.25)
    args = parser.parse_args(argv)
    found = regressions(json.loads(args.baseline.read_text()),
                        json.loads(args.current.read_text()), args.tolerance)
    for line in found:
        print(f"regressed: {line}")
    if not found:
        print(f"no ratio regressed by more than {args.tolerance:.0%}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
