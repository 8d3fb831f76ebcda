"""A SIGKILLed Hands' run is taken over as soon as NATS says its connection is gone.

The attempt's heartbeat stays fresh for ``attempt_ttl`` and the Brain's progress deadline
would redispatch only much later; both are set far beyond the settle time here, so the run can
complete in time only through the liveness path: the dead Hands' tool message comes back after
the tool consumers' ack_wait, the clean Hands finds the attempt busy, asks the holder over NATS
(baton.hands.liveness), hears "no responders" and claims the attempt under a new fence.
A frozen Hands (SIGSTOP, connection still open) is not taken over this way: see
test_stale_workers.py, where the heartbeat's expiry decides.
"""

from __future__ import annotations

import pytest

from tests.crash.conftest import Opener

pytestmark = [pytest.mark.crash, pytest.mark.timeout(90)]

FAR = {"BATON_ATTEMPT_TTL_MS": "600000", "BATON_PROGRESS_DEADLINE_MS": "600000"}
ONE_AT_A_TIME = {"BATON_HANDS_CONCURRENCY": "1"}


async def test_killed_hands_is_taken_over_by_liveness_not_ttl(crash: Opener) -> None:
    c = await crash(brains=1, hands=0, relays=1, env=FAR)
    armed = await c.spawn_armed("hands", "hands.after_effect@2", env=ONE_AT_A_TIME)
    sub = await c.submit()
    await c.died_at(armed.name, "hands.after_effect")
    clean = await c.replace(armed.name, env=ONE_AT_A_TIME)
    final = await c.settle(sub)  # well within attempt_ttl and the progress deadline
    await c.check_completed(final, {"grace@example.com": "confirmed after recovery"})
    await c.check_exactly_once(raw_requests=5)  # confirm adopted the delivery, no re-send

    second = (await c.runs(sub.session_id))[1]
    assert second.worker == clean.name and second.result is not None
    assert second.result.recovery == "confirmed", second.result
    (reclaim,) = [r for r in await c.receipts(sub.session_id, "reclaim")
                  if r.detail.run_id == second.run_id]
    assert reclaim.detail.previous_worker == armed.name, reclaim
    gone = c.events(clean.name, "attempt_holder_gone", run_id=second.run_id)
    assert gone and gone[0]["previous_worker"] == armed.name, gone
