"""The five notices as a PydanticAI agent (baton.examples.pydantic_notices), SIGKILLed where
it hurts: Hands right after the fourth mail was delivered (its reply never saved), and a
Brain after the tool results completed or while the model streams. Another replica carries
on, completed tool results are reused, and every recipient gets exactly one mail.
"""

from __future__ import annotations

import pytest

from tests.crash.conftest import Opener
from tests.crash.test_fault_points import ONE_AT_A_TIME, Case

pytestmark = [pytest.mark.crash, pytest.mark.timeout(90)]

APP = "baton.examples.pydantic_notices:app"

CASES = [
    Case("hands.after_effect", "hands", 4, "mail 4 delivered, its reply never saved",
         fates=(("margaret@example.com", "confirmed after recovery"),)),
    Case("brain.after_wake", "brain", 2, "tool results completed, not yet applied"),
    Case("brain.during_model", "brain", 1, "the first model call is running"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.point for c in CASES])
async def test_pydantic_ai_agent_killed_sends_each_mail_once(crash: Opener, case: Case) -> None:
    counts = {"brains": 1, "hands": 1, "relays": 1}
    counts[{"brain": "brains", "hands": "hands"}[case.role]] = 0
    c = await crash(app_spec=APP, **counts)
    armed = await c.spawn_armed(case.role, case.spec, env=ONE_AT_A_TIME)
    sub = await c.submit()
    await c.died_at(armed.name, case.point)
    clean = await c.replace(armed.name, env=ONE_AT_A_TIME)
    final = await c.settle(sub)
    await c.check_completed(final, dict(case.fates))
    await c.check_exactly_once(raw_requests=5)  # nothing re-sent raw: confirm sufficed
    runs = await c.runs(sub.session_id)
    if case.role == "hands":
        fourth = runs[3]
        assert fourth.worker == clean.name and fourth.result is not None
        assert fourth.result.recovery == "confirmed", fourth.result
    else:
        # Every tool result was produced once, by the first attempt, and reused after the
        # takeover (none executed again).
        assert all(r.result and r.result.recovery == "none" and r.attempt == 1 for r in runs)
        takeovers = await c.receipts(sub.session_id, "takeover")
        assert takeovers and takeovers[0].detail.previous_holder == armed.name, takeovers
