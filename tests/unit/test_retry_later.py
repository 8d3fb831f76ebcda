"""A message that met unreachable servers comes back later each time, and on its last
delivery is terminated (the session's progress deadline brings its work back) instead of
sitting in the stream for good. Redelivered every 0.5 s, the eight deliveries JetStream
allows were spent in four seconds of a Redis outage."""

from __future__ import annotations

from typing import Any

from baton.bus.messages import retry_later


class Msg:
    """What retry_later calls on a JetStream message (pure logic: no server needed)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def nak(self, delay: float | None = None) -> None:
        self.calls.append(("nak", delay))

    async def term(self) -> None:
        self.calls.append(("term", None))


async def test_the_delay_doubles_and_the_last_delivery_is_terminated() -> None:
    msg = Msg()
    outcomes = [await retry_later(msg, d, 8, "tool message") for d in range(1, 9)]  # type: ignore[arg-type]
    assert outcomes == ["retry"] * 7 + ["given_up"]
    assert msg.calls == [("nak", 0.5), ("nak", 1.0), ("nak", 2.0), ("nak", 4.0),
                         ("nak", 8.0), ("nak", 16.0), ("nak", 30.0), ("term", None)]
    assert sum(d for _, d in msg.calls[:-1]) > 60  # the deliveries outlast a minute's outage


class Held:
    subject = "ns.tool.slow_sync"
    is_acked = False

    async def in_progress(self) -> None:
        pass


async def test_a_blocked_event_loop_is_told_with_the_tools_in_hand() -> None:
    """A tool calling time.sleep blocked the Hands' loop past the attempt ttl: its run was
    taken over and ended 'interrupted', and no line said why."""
    import asyncio
    import time

    from baton.bus.messages import Beats

    told: list[tuple[float, list[str]]] = []
    seen = asyncio.Event()

    def on_late(late: float, subjects: list[str]) -> None:
        told.append((late, subjects))
        seen.set()

    beats = Beats(0.1, late_after_s=0.2, on_late=on_late)
    async with beats.beating(Held()):  # type: ignore[arg-type]
        # the tool's blocking call, on the loop itself, once the beats loop has started
        asyncio.get_running_loop().call_later(0.01, time.sleep, 0.5)
        await asyncio.wait_for(seen.wait(), 10)
    await beats.close()
    assert told[0][1] == ["ns.tool.slow_sync"] and told[0][0] > 0.2
