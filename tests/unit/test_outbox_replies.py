"""The relay's raw Redis replies are read the same in either protocol version."""

from __future__ import annotations

from baton.store.outbox import _head


def test_a_timer_head_reads_alike_in_resp2_and_resp3() -> None:
    assert _head(["deadline|s|-|ns.wake.a.1", "1764567890123"]) == 1764567890123  # RESP2
    assert _head([["deadline|s|-|ns.wake.a.1", 1764567890123.0]]) == 1764567890123  # RESP3
