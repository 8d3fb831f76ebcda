"""The baselines of bench e2e pool their passes: measured before and after Baton's sessions,
each figure is over both passes (baton.bench.baselines)."""

from __future__ import annotations

import asyncio

from baton.bench.baselines import Baseline, pooled
from baton.bench.common import Run


def test_pooled_runs_add_their_times_and_keep_every_latency() -> None:
    run = pooled([Run([1, 2, 3], 1.0, 0.5), Run([10, 20], 3.0, 0.25)])
    assert sorted(run.samples_ns) == [1, 2, 3, 10, 20]
    assert run.elapsed_s == 4.0 and run.cpu_s == 0.75 and run.probed is None
    assert pooled([Run([1], 1.0, 0.5, 0.25), Run([2], 1.0, 0.5, 0.5)]).probed == 0.75


async def test_two_passes_make_one_row_and_cpu_over_both() -> None:
    sessions = 0
    mail_cpu = iter([0.0, 0.3, 0.3, 0.4])  # the mail service's CPU seconds at each reading

    async def session() -> None:
        nonlocal sessions
        sessions += 1
        await asyncio.sleep(0)

    baseline = Baseline("m", "op", session, "loop", lambda _pid: next(mail_cpu))
    await baseline.run([(2, 4, 1)], mail_pid=123)  # 2 workers: 1 warm-up + 2 timed each
    await baseline.run([(2, 4, 1)], mail_pid=123)
    assert sessions == 12
    row = baseline.rows()[2]
    assert row.n == 8 and row.writers == 2 and row.mode == "m"
    cpu = baseline.cpu()[2]
    assert set(cpu) == {"loop", "mailbox"}
    # the mail service read around each pass's timed part: (0.3 + 0.1) s over 8 sessions
    assert abs(cpu["mailbox"] - 0.4 * 1000 / 8) < 1e-9
