"""``bench limits`` (baton.bench.limits_bench): its accuracy figures from the mail service's
timestamps, and the tool declared four ways (baton.bench.limits_apps). Figures, not timing."""

from __future__ import annotations

import math

from baton.bench.limits_apps import CAP, LOOSE_CAP, LOOSE_RATE, RATE, capped, loose, rated, uncapped
from baton.bench.limits_bench import HANDS, accepted_per_s, busiest_second
from baton.settings import Settings


def test_the_rate_is_counted_between_the_first_and_the_last_delivery() -> None:
    assert accepted_per_s([1000.0 + 50 * k for k in range(21)]) == 20.0
    assert math.isnan(accepted_per_s([5.0])) and math.isnan(accepted_per_s([5.0, 5.0]))


def test_the_busiest_second_is_a_window_starting_at_a_delivery() -> None:
    assert busiest_second([]) == 0
    assert busiest_second([0, 100, 999, 1000, 1500, 1600, 1700, 1999.9]) == 5  # 1000..1999.9
    assert busiest_second([0.0 + 50 * k for k in range(40)]) == 20


def test_the_four_tools_differ_in_their_limit_alone() -> None:
    tools = {name: app.tools["send_email"] for name, app in
             (("uncapped", uncapped), ("loose", loose), ("capped", capped), ("rated", rated))}
    assert not tools["uncapped"].limit.limited  # the Hands skip the limit code for it
    assert (tools["capped"].limit.max_concurrency, tools["capped"].limit.per_second) == (CAP, 0)
    assert (tools["rated"].limit.max_concurrency, tools["rated"].limit.per_second) == (0, RATE)
    # The cap that never binds: above every run the bench's Hands can hold at once.
    assert LOOSE_CAP > HANDS * Settings().hands_concurrency
    assert tools["loose"].limit.per_second == LOOSE_RATE
    assert {t.replay for t in tools.values()} == {"confirm"}
    assert len({t.fn for t in tools.values()}) == 1
