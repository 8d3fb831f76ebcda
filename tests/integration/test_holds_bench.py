"""``bench holds`` (baton.bench.holds_bench) times the sessions it says it does: each stack's
run of a round covers ``per_round`` sessions, not ``per_round`` divided by the concurrency.
Its tables name the modes with the glossary's word, hold ("held" is only a stored name)."""

from __future__ import annotations

from io import StringIO

from rich.console import Console

from baton.bench.holds_bench import CONCURRENCY, MODES, Config, run


async def test_each_run_times_the_sessions_of_a_round() -> None:
    cfg = Config(rounds=1, per_round=2 * CONCURRENCY, c1=1)
    out = StringIO()
    result = await run(console=Console(file=out, width=200), cfg=cfg)
    assert result.extra["sessions_measured"] == {m: [cfg.per_round] for m in MODES}
    assert [row.n for row in result.rows] == [cfg.rounds * cfg.per_round] * len(MODES)
    assert "holds off again" in out.getvalue() and "held" not in out.getvalue().lower()
