"""Duplicates are harmless, a lost wake is recovered, and each replay policy decides the fate
of a run whose Hands died after acting (DESIGN 4.4, 4.6, 4.7), with real processes.

Topologies: every test runs on one Redis server;
test_lost_wake_is_recovered_by_the_progress_deadline also runs on a 3+6 Redis Cluster
(DevStack(cluster=True)), the file's representative case (a cluster stack takes seconds to
start; the suite's time allows one per file).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from baton.bus.bus import Bus
from baton.models import ToolDispatch, Wake
from baton.store.deadletter import dead_letter_count
from tests.conftest import TOPOLOGIES
from tests.crash.conftest import Crash, Opener
from tests.helpers import eventually

pytestmark = [pytest.mark.crash, pytest.mark.timeout(90)]

ONE_AT_A_TIME = {"BATON_HANDS_CONCURRENCY": "1"}


@pytest.fixture
async def dup_bus(crash: Opener) -> AsyncIterator[tuple[Crash, Bus]]:
    c = await crash(brains=2, hands=2, relays=1, mail_delay_ms=300)
    bus = await Bus.connect(c.stack.settings(), "crash-test-duplicates")
    try:
        yield c, bus
    finally:
        await bus.close()


async def _drained(bus: Bus) -> None:
    """Every wake and tool message was handled and acknowledged."""
    js, names = bus.nc.jetstream(), bus.names

    async def idle() -> bool:
        for stream, durable in ((names.wake_stream, names.wake_durable("notices", 1)),
                                (names.tool_stream, names.tool_durable("send_email"))):
            info = await js.consumer_info(stream, durable)
            if info.num_pending or info.num_ack_pending:
                return False
        return True

    await eventually(idle, timeout=15, interval=0.05, message="wake and tool consumers drained")


async def test_duplicate_wakes_and_tool_messages_are_harmless(
    dup_bus: tuple[Crash, Bus],
) -> None:
    c, bus = dup_bus
    sub = await c.submit()
    session = sub.session_id
    wake_subject = bus.names.wake_subject("notices", 1)
    tool_subject = bus.names.tool_subject("send_email")

    async def wakes(tag: str, n: int = 3) -> None:
        data = Wake(session_id=session, reason=f"duplicate-{tag}").to_json().encode()
        for i in range(n):  # new Nats-Msg-Ids: JetStream stores and delivers every copy
            await bus.publish(wake_subject, data, msg_id=f"dup-wake-{tag}-{i}")

    async def tool_messages(tag: str) -> None:
        for run in await c.runs(session):
            msg = ToolDispatch(session_id=session, run_id=run.run_id, tool=run.intent.tool)
            await bus.publish(tool_subject, msg.to_json().encode(),
                              msg_id=f"dup-tool-{tag}-{run.run_id}")

    await wakes("early")
    # While the mails are in flight (the service holds each reply 300 ms): more of both.
    await eventually(lambda: _running(c, session), timeout=15, message="sends in flight")
    await wakes("mid")
    await tool_messages("mid")
    final = await c.settle(sub)
    await c.check_completed(final)
    await c.check_exactly_once(raw_requests=5)

    # After the end: the same again; once all are consumed, nothing has changed.
    receipts = await c.receipts(session)
    entries = await c.entries(session)
    await wakes("late")
    await tool_messages("late")
    await _drained(bus)
    after = (await c.receipts(session))[len(receipts):]
    assert {r.kind for r in after} <= {"lease"}, after  # looked, found nothing to do
    assert await c.entries(session) == entries
    assert await c.store.inbox.submission(session, sub.id) == final
    await c.check_exactly_once(raw_requests=5)
    claims = [r for r in await c.receipts(session) if r.kind in ("claim", "reclaim")]
    assert len(claims) == 5, claims
    assert await dead_letter_count(c.store.redis, c.store.keys) == 0, \
        "a duplicate was dead-lettered"
    duplicates = sum(len(c.events(h, "tool_message_handled", session_id=session,
                                  outcome="duplicate")) for h in ("hands-1", "hands-2"))
    assert duplicates >= 10, duplicates  # every copy was recognised by its claim


async def _running(c: Crash, session: str) -> bool:
    runs = await c.runs(session)
    return len(runs) == 5 and any(r.status == "running" for r in runs)


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_lost_wake_is_recovered_by_the_progress_deadline(
    crash: Opener, topology: str
) -> None:
    """The submit's wake row disappears before any relay saw it, and the request armed no
    timer (a client writes no shard-wide timer): the relay that takes the shard sweeps its
    inboxes, arms the session's progress deadline, and that wakes it anyway."""
    c = await crash(brains=1, hands=2, relays=0, env={"BATON_PROGRESS_DEADLINE_MS": "1500"})
    sub = await c.submit()
    session = sub.session_id
    sk = c.store.keys.session(session)
    redis: Any = c.store.redis  # decode_responses=True: str in, str out
    rows = [(i, f) for i, f in await redis.xrange(sk.wakes) if f.get("sid") == session]
    assert len(rows) == 1 and Wake.model_validate_json(rows[0][1]["data"]).reason == "submit"
    assert await redis.xdel(sk.wakes, rows[0][0]) == 1
    timers = await redis.zrange(sk.timers, 0, -1)
    assert not any(t.startswith(f"deadline|{session}|") for t in timers), timers

    await c.stack.spawn("relay")
    final = await c.settle(sub)
    await c.check_completed(final)
    await c.check_exactly_once(raw_requests=5)
    handled = c.events("brain-1", "wake_handled", session_id=session)
    assert handled and handled[0]["reason"] == "timer:deadline", handled
    assert not [e for e in handled if e["reason"] == "submit"], "the deleted wake was delivered"


POLICIES = [
    # policy, the 4th mail's outcome, its line in the summary, executions, recovery
    ("unsafe", "interrupted", "interrupted", 5, "interrupted"),
    ("safe", "ok", "sent", 6, "reexecuted"),
]


@pytest.mark.parametrize(("policy", "outcome", "fate", "executions", "recovery"), POLICIES,
                         ids=[p[0] for p in POLICIES])
async def test_replay_policy_after_the_effect(
    crash: Opener, policy: str, outcome: str, fate: str, executions: int, recovery: str,
) -> None:
    """The Hands dies after mail 4 acted, before saving the result. ``unsafe``: never run
    again, the run ends interrupted and the summary says so. ``safe``: run again (the mail
    service's idempotency key keeps it to one delivery)."""
    c = await crash(brains=1, hands=0, relays=1, app_spec=f"tests.apps:{policy}_app")
    armed = await c.spawn_armed("hands", "hands.after_effect@4", env=ONE_AT_A_TIME)
    sub = await c.submit()
    await c.died_at(armed.name, "hands.after_effect")
    clean = await c.replace(armed.name, env=ONE_AT_A_TIME)
    final = await c.settle(sub)

    fourth = (await c.runs(sub.session_id))[3]
    to = fourth.intent.arguments["to"]
    assert to == "margaret@example.com" and fourth.intent.replay == policy
    assert fourth.result is not None and fourth.worker == clean.name
    assert (fourth.result.outcome, fourth.result.recovery) == (outcome, recovery), fourth.result
    await c.check_completed(final, {to: fate})
    stats = await c.check_exactly_once(raw_requests=executions)  # the effect counter
    assert stats["duplicates_suppressed"] == executions - 5
