"""A short ``baton chaos --cluster --partitions`` round: kills and network cuts, every
invariant of the chaos report holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.devkit.chaos.run import ChaosConfig, run_chaos

pytestmark = pytest.mark.partition


async def test_kills_and_partitions_on_the_cluster_break_no_invariant(tmp_path: Path) -> None:
    cfg = ChaosConfig(sessions=12, kill_every=3.0, rate=2.0, seed=5, cluster=True,
                      partitions=3, deadline=240.0)
    report = await run_chaos(cfg, tmp_path)
    summary = report.summary()
    assert not report.violations, "\n".join(report.violations)
    assert summary["settled"] == summary["sessions"] == 12, summary
    assert sum(report.partitions.values()) == 3, summary
