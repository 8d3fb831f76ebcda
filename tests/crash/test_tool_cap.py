"""A Hands SIGKILLed while it holds a slot of a tool capped for the whole fleet
(``tests.integration.capped_apps``: ``send_email`` with ``max_concurrency=3``).

Its slot is not lost for good: once its time (``BATON_ATTEMPT_TTL_MS``) passed unrenewed
the runs waiting get it, and the run it held is taken over; the mail service (which counts
its sends in flight) never sees more than the cap at once, and each recipient gets one mail.
"""

from __future__ import annotations

from collections import Counter

import pytest

from baton.store.limits import Limits
from tests.crash.conftest import Opener
from tests.helpers import eventually
from tests.integration.capped_apps import CAP, capped_email

pytestmark = [pytest.mark.crash, pytest.mark.timeout(180)]

APP = "tests.integration.capped_apps:app"
SESSIONS = 6


def notice(n: int) -> str:
    to = ", ".join(f"k{n}-{i}@example.com" for i in range(5))
    return f"Send the approved notice to {to}, then summarise."


async def test_a_slot_holder_killed_gives_its_slot_back_and_the_cap_holds(
    crash: Opener,
) -> None:
    c = await crash(brains=1, hands=2, relays=1, app_spec=APP)
    # A third Hands dies (SIGKILL) right after claiming its second run, holding its slot.
    armed = await c.spawn_armed("hands", "hands.after_claim@2")
    subs = [(await c.client.submit(notice(n), agent="notices"))[0] for n in range(SESSIONS)]
    await c.died_at(armed.name, "hands.after_claim")
    finals = [await c.settle(sub, timeout=90) for sub in subs]
    assert {f.status for f in finals} == {"completed"}, finals
    stats = await c.stats()
    assert stats["max_in_flight"] <= CAP, stats
    deliveries = Counter(stats["deliveries"])
    assert len(deliveries) == SESSIONS * 5 and set(deliveries.values()) == {1}, stats
    # Every slot and place given back: the dead holder's lapsed, the others released theirs.
    # (Eventually: a late redelivery of a finished run takes a slot for the moment its claim
    # takes to say "done", then gives it back.)
    settings = c.stack.settings()
    limits = Limits(c.store.redis, c.store.keys, slot_ms=settings.attempt_ttl_ms)

    async def given_back() -> bool:
        usage = await limits.look("send_email", capped_email.limit)
        return (usage.in_use, usage.waiting) == (0, 0)
    await eventually(given_back, timeout=60, message="every slot and place given back")
    assert any(e.get("tool") == "send_email" for e in c.events("hands-1", "tool_run_waiting")
               + c.events("hands-2", "tool_run_waiting")), "no run ever waited for a slot"
