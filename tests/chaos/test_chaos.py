"""Chaos runs (``baton.devkit.chaos.run``) as tests: the same runner and checks as ``baton chaos``.

The short run is part of the default suite (marked ``crash``): a few kills and a Redis restart
under ten sessions, within about a minute. The long run is marked ``chaos`` and run by ``make
test-chaos``: more sessions, kills every second, pauses past the lease, Redis and NATS restarts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.devkit.chaos.run import ChaosConfig, ChaosReport, run_chaos


def _passed(report: ChaosReport) -> None:
    summary = report.summary()
    assert not report.violations, "\n".join(report.violations)
    assert summary["settled"] == summary["sessions"], summary
    assert summary["duplicates"] == 0 and summary["raw_resends"] == 0, summary


@pytest.mark.crash
@pytest.mark.timeout(120)
async def test_short_chaos_run(tmp_path: Path) -> None:
    cfg = ChaosConfig(sessions=10, kill_every=1.0, restart_redis=1, rate=3.0, seed=7,
                      unsafe_share=0.3, deadline=90.0)
    report = await run_chaos(cfg, tmp_path)
    _passed(report)
    assert sum(report.kills.values()) >= 2, report.summary()
    assert report.restarts["redis"] == 1
    assert report.summary()["deliveries"] >= 10 * 5 * 0.7  # every confirm mail, at least


@pytest.mark.crash
@pytest.mark.timeout(120)
async def test_short_chaos_run_with_archival(tmp_path: Path) -> None:
    """Sessions archived one second after they settle while workers are killed; half of them
    then continued by a second submission, which restores them: every session settles (both
    rounds), one mail per recipient, each continued session restored."""
    cfg = ChaosConfig(sessions=10, kill_every=1.0, rate=3.0, seed=9, unsafe_share=0.0,
                      deadline=90.0, archive_s=1.0, restore_share=0.5)
    report = await run_chaos(cfg, tmp_path)
    _passed(report)
    summary = report.summary()
    assert summary["archived_and_restored"] == 5, summary
    assert summary["deliveries"] == (10 + 5) * 5, summary


@pytest.mark.chaos
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", [101, 202])
async def test_long_chaos_run(tmp_path: Path, seed: int) -> None:
    cfg = ChaosConfig(sessions=200, kill_every=1.0, pause_every=3.0, restart_redis=2,
                      restart_nats=2, seed=seed, deadline=600.0, archive_s=2.0)
    report = await run_chaos(cfg, tmp_path)
    _passed(report)
    assert report.pauses > 0 and report.restarts["nats"] == 2


@pytest.mark.crash
@pytest.mark.timeout(300)
async def test_short_chaos_run_while_shard_slots_move(tmp_path: Path) -> None:
    """``baton chaos --cluster --reshard N``: the slots of the shards move between primaries,
    two keys per MIGRATE (sessions split over two nodes meanwhile), while workers are
    killed: every session settles, one mail per recipient, no stale write applied."""
    cfg = ChaosConfig(sessions=10, kill_every=2.0, rate=2.0, seed=11, unsafe_share=0.0,
                      deadline=180.0, cluster=True, reshard=8)
    report = await run_chaos(cfg, tmp_path)
    _passed(report)
    summary = report.summary()
    assert summary["slot_moves"] == 8, summary
    assert summary["deliveries"] == 10 * 5, summary
