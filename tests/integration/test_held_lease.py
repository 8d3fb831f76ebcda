"""A pass that dispatched tool runs holds its lease for their results (baton.brain.held):
the result that wakes the session comes to the holding Brain on its hold channel, not
through the relay; whatever fails, the result is still applied, once.

Against a real redis-server and nats-server: Brain, Hands and relay in one event loop for
the flow (on one Redis server and on a 3+3 Redis Cluster, where the Brain listens on each
primary serving its channels), the store alone for the scripts' rules.
"""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from baton.brain.held import Holds, hold_name
from baton.brain.worker import BrainWorker
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.examples.notices import app
from baton.hands.worker import HandsWorker
from baton.models import Entry, Task, ToolIntent, ToolResult
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.store import Release, Store, worker_ref
from baton.store.writes import Writes
from tests.conftest import TOPOLOGIES
from tests.helpers import eventually, running, take_up
from tests.otel_host import host_telemetry

FIVE = ("Send the approved notice to ada@example.com, grace@example.com, linus@example.com, "
        "margaret@example.com and barbara@example.com, then summarise.")
BRAIN = worker_ref("brain", "brain-a")
BRAIN_B = worker_ref("brain", "brain-b")
HANDS = worker_ref("hands", "hands-a")
WAKE = "t.wake.notices.1"


async def _mails(mailbox: MailboxServer) -> dict[str, int]:
    async with httpx.AsyncClient() as http:
        stats = (await http.get(f"{mailbox.url}/stats")).json()
    assert stats["raw_requests"] == 5, stats
    return dict(stats["deliveries"])


async def _five_notices(settings: Settings, brain: BrainWorker) -> str:
    hands = HandsWorker(settings.model_copy(update={"worker_name": "hands-1"}), app)
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    async with running(relay, hands, brain):
        assert brain.holds is not None
        client = await Client.connect(settings)
        try:
            sub, _ = await client.submit(FIVE, agent="notices")
            final = await client.wait(sub, timeout=30)
        finally:
            await client.close()
    assert final.status == "completed", final
    assert final.answer and final.answer.count(": sent") == 5
    return sub.session_id


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_the_result_reaches_the_holding_brain_without_a_relay_wake(
    topology: str, topo_settings: Settings, mailbox: MailboxServer
) -> None:
    settings = topo_settings.model_copy(update={"mail_url": mailbox.url})
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app)
    await _five_notices(settings, brain)
    assert brain.holds is not None and brain.holds.listening is False  # stopped with the Brain
    # One wake from JetStream (the submit's); the group's last result came as a signal.
    assert brain.handled == 1
    assert brain.holds.heard == 1
    assert all(n == 1 for n in (await _mails(mailbox)).values())


async def test_without_holds_the_result_wakes_through_the_relay(
    settings: Settings, mailbox: MailboxServer
) -> None:
    settings = settings.model_copy(update={"mail_url": mailbox.url, "brain_hold_ms": 0})
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app)
    await _five_notices(settings, brain)
    assert brain.holds is not None and brain.holds.heard == 0
    assert brain.handled == 2  # the submit's wake and the group's result's


async def test_a_lost_signal_costs_the_hold_and_loses_nothing(
    settings: Settings, mailbox: MailboxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The signal is dropped on arrival: the hold ends at its length, and the release finds
    # the nudge the completion set.
    monkeypatch.setattr(Holds, "_on_signal", lambda self, sid: None)
    settings = settings.model_copy(update={"mail_url": mailbox.url, "brain_hold_ms": 300})
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app)
    with host_telemetry() as host:
        sid = await _five_notices(settings, brain)
    assert brain.holds is not None and brain.holds.heard == 1
    assert brain.handled == 1  # no relay wake either: the release rechecked
    assert all(n == 1 for n in (await _mails(mailbox)).values())
    # The trace shows that recheck (span "look"), unheard, the lease kept: it ran without
    # a signal, but it is where the results were taken up.
    looks = [s for s in host.spans.get_finished_spans() if s.name == "look"
             and s.attributes is not None and s.attributes.get("baton.session_id") == sid]
    assert [(s.attributes["baton.heard"], s.attributes["baton.kept"])  # type: ignore[index]
            for s in looks] == [(False, True)], looks


# --- the scripts' rules ------------------------------------------------------------------


async def _leased(store: Store, ttl: int) -> tuple[str, int]:
    """A session opened and taken up, leased by BRAIN; (session id, fence)."""
    sid = "hl-" + uuid.uuid4().hex[:10]
    await store.inbox.submit(sid, agent="notices", compat=1, wake_subject=WAKE, request_id="r1",
                             text="hi", task=Task(id=f"{sid}-t", kind="generation", owner=sid),
                             worker=worker_ref("client", "c"), submission_id=f"{sid}-sub")
    await take_up(store, sid, BRAIN)
    lease, _ = await store.acquire_and_load(sid, BRAIN, ttl)
    return sid, lease.fence


async def _dispatched(store: Store, hold_as: str, *, ttl: int = 60_000) -> tuple[str, int]:
    """A session whose Brain committed one tool run as its pass's last commit, holding
    (``hold_as``) or releasing (""); returns (session id, fence)."""
    sid, fence = await _leased(store, ttl)
    intent = ToolIntent(run_id=f"{sid}-run", session_id=sid, task_id=f"{sid}-t",
                        tool="send_email", arguments={"to": "ada@example.com"},
                        operation_id=f"{sid}-op", wake_subject=WAKE)
    writes = Writes(kind="tool_intents", entries=[Entry(kind="model", text="send")],
                    runs=[intent], release_ttl_ms=ttl, hold_as=hold_as)
    _, _, outcome = await store.commit_and_release(sid, fence, writes, BRAIN)
    assert outcome == (Release.HELD if hold_as else Release.RELEASED)
    return sid, fence


async def _complete(store: Store, sid: str) -> bool:
    run_id = f"{sid}-run"
    claim = await store.runs.claim(sid, run_id, HANDS)
    assert claim.status == "claimed" and claim.intent is not None, claim
    return await store.runs.complete(sid, claim.intent, claim.attempt,
                                     ToolResult(outcome="ok", output="sent"), HANDS)


async def _wake_rows(store: Store, sid: str) -> int:
    """Wake rows of the session's tool results in its shard's wakes stream (no relay
    runs here to take them; the submit's own row is not counted)."""
    stream = store.keys.wakes(store.keys.shard_of(sid))
    rows = await store.redis.xrange(stream)
    return sum(1 for _, f in rows if f.get("sid") == sid and "/w." in f.get("id", ""))


async def _listen(store: Store, sid: str, name: str) -> tuple[object, str]:
    pubsub = store.redis.pubsub()
    channel = store.keys.hold_channel(store.keys.shard_of(sid), name)
    await pubsub.ssubscribe(channel)
    confirmed = await pubsub.get_message(timeout=5)
    assert confirmed and confirmed["type"] == "ssubscribe"
    return pubsub, channel


async def test_a_completion_tells_the_holder_and_writes_no_wake_row(store: Store) -> None:
    name = hold_name(BRAIN.name)
    sid, fence = await _dispatched(store, name)
    sk = store.keys.session(sid)
    assert await store.redis.hget(sk.meta, "listen") == name
    pubsub, _ = await _listen(store, sid, name)
    try:
        assert await _complete(store, sid)
        signal = await eventually(lambda: pubsub.get_message(timeout=1), timeout=10)
    finally:
        await pubsub.aclose()
    assert signal["type"] == "smessage" and signal["data"].split(" ")[0] == sid
    assert await _wake_rows(store, sid) == 0
    assert await store.redis.get(sk.nudge) == "1"
    # The holder's release finds the result: the lease is kept for its recheck, the hold ends.
    assert await store.release(sid, fence, 60_000)
    meta = await store.redis.hgetall(sk.meta)
    assert meta["listen"] == "" and meta["holder"] == BRAIN.name
    assert not await store.redis.exists(sk.nudge)


async def test_a_completion_after_the_hold_ended_writes_the_wake_row(store: Store) -> None:
    sid, fence = await _dispatched(store, hold_name(BRAIN.name))
    assert not await store.release(sid, fence, 60_000)  # the hold ended, nothing arrived
    assert await store.redis.hget(store.keys.session(sid).meta, "listen") == ""
    assert await _complete(store, sid)
    assert await _wake_rows(store, sid) == 1


async def test_a_lapsed_holders_results_wake_through_the_relay(store: Store) -> None:
    # The holder died holding: once its lease lapsed, a result is not told to it but
    # written as a wake row, and the next Brain's lease ends the hold for good.
    sid, _ = await _dispatched(store, hold_name(BRAIN.name))
    sk = store.keys.session(sid)
    await store.redis.hset(sk.meta, "lease_until", 1)  # lapsed
    assert await _complete(store, sid)
    assert await _wake_rows(store, sid) == 1
    lease, state = await store.acquire_and_load(sid, BRAIN_B, 60_000)
    assert lease.takeover and state.runs[f"{sid}-run"].status == "completed"
    assert await store.redis.hget(sk.meta, "listen") == ""


async def test_a_new_lease_ends_a_hold_it_took_over(store: Store) -> None:
    sid, _ = await _dispatched(store, hold_name(BRAIN.name), ttl=200)
    sk = store.keys.session(sid)

    async def lapsed() -> bool:
        return int(await store.redis.hget(sk.meta, "lease_until") or 0) < await _now(store)

    await eventually(lapsed, timeout=10)
    await store.acquire_and_load(sid, BRAIN_B, 60_000)
    assert await store.redis.hget(sk.meta, "listen") == ""
    assert await _complete(store, sid)
    assert await _wake_rows(store, sid) == 1  # nobody listens: the relay wakes the session


async def test_a_holder_name_commit_lua_refuses_is_invalid(store: Store) -> None:
    from baton.errors import ValidationError

    sid, fence = await _leased(store, 60_000)
    writes = Writes(kind="final", entries=[Entry(kind="model", text="x")],
                    release_ttl_ms=60_000, hold_as="no spaces {here}")
    with pytest.raises(ValidationError):
        await store.commit_and_release(sid, fence, writes, BRAIN)
    assert await store.redis.hget(store.keys.session(sid).meta, "listen") in (None, "")


def test_hold_names_keep_what_commit_lua_accepts() -> None:
    assert hold_name("brain-host-12") == "brain-host-12"
    assert hold_name("my brain/{1}") == "my_brain__1_"


async def _now(store: Store) -> int:
    sec, usec = await store.redis.time()
    return int(sec) * 1000 + int(usec) // 1000


async def test_a_brain_stopping_ends_its_holds_at_once(settings: Settings) -> None:
    store = await Store.connect(settings)
    stopping = asyncio.Event()
    held = Holds(store.redis, store.keys, "brain-x", settings.shards, hold_ms=600_000,
                        limit=8, stopping=stopping)
    listener = asyncio.create_task(held.run())
    try:
        await asyncio.wait_for(held.tried.wait(), 10)
        assert held.listening and held.can_hold()
        waiting = asyncio.create_task(held.hold("s-1"))
        await eventually(lambda: held.holding == 1)
        stopping.set()
        await asyncio.wait_for(waiting, 10)  # far sooner than its hold's length
        assert held.holding == 0 and not held.can_hold()
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        await store.close()


async def test_a_clients_request_to_a_held_session_tells_the_holder(store: Store) -> None:
    # Its wake row goes to the relay as ever (another Brain could act on it only once the
    # lease is free); the holder is told at once and its release finds the nudge.
    name = hold_name(BRAIN.name)
    sid, fence = await _dispatched(store, name)
    pubsub, _ = await _listen(store, sid, name)
    try:
        await store.inbox.submit(sid, agent="notices", compat=1, wake_subject=WAKE, request_id="r2",
                                 text="and one more", task=Task(id=f"{sid}-t2", kind="generation",
                                                          owner=sid),
                                 worker=worker_ref("client", "c"), submission_id=f"{sid}-sub2")
        signal = await eventually(lambda: pubsub.get_message(timeout=1), timeout=10)
    finally:
        await pubsub.aclose()
    assert signal["type"] == "smessage" and signal["data"].split(" ")[0] == sid
    state = await store.release_and_load(sid, fence, 60_000)
    assert state is not None and [r.request_id for r in state.requests] == ["r2"]


async def test_a_later_last_commit_ends_an_earlier_hold(store: Store) -> None:
    # A commit after the one that held (a sleeping task fell due meanwhile) is the pass's
    # last: it releases, and the hold is over for the completions too.
    sid, fence = await _dispatched(store, hold_name(BRAIN.name))
    writes = Writes(kind="final", entries=[Entry(kind="model", text="later")],
                    release_ttl_ms=60_000)
    _, _, outcome = await store.commit_and_release(sid, fence, writes, BRAIN)
    assert outcome == Release.RELEASED
    meta = await store.redis.hgetall(store.keys.session(sid).meta)
    assert meta["listen"] == "" and meta["holder"] == ""
    assert await _complete(store, sid)
    assert await _wake_rows(store, sid) == 1


async def test_inspect_says_a_lease_is_held_for_tool_results(store: Store) -> None:
    from baton.cli.inspect import session_view

    sid, fence = await _dispatched(store, hold_name(BRAIN.name))
    view = await session_view(store, sid)
    assert view["lease"]["live"] and view["lease"]["held_for_results"]
    assert not await store.release(sid, fence, 60_000)
    view = await session_view(store, sid)
    assert not view["lease"]["live"] and not view["lease"]["held_for_results"]


async def test_a_listener_that_cannot_subscribe_tries_again(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A first try that fails before any connection (a cluster's slot map changing): no
    # holds meanwhile, and the listener subscribes at its next try.
    real = Holds._subscriptions
    tries: list[int] = []

    def flaky(self: Holds) -> list[tuple[object, list[str]]]:
        tries.append(1)
        if len(tries) == 1:
            raise AttributeError("'NoneType' object has no attribute 'name'")
        return real(self)

    monkeypatch.setattr(Holds, "_subscriptions", flaky)
    store = await Store.connect(settings)
    held = Holds(store.redis, store.keys, "brain-x", settings.shards, hold_ms=1_000,
                        limit=8, stopping=asyncio.Event())
    listener = asyncio.create_task(held.run())
    try:
        await asyncio.wait_for(held.tried.wait(), 10)  # the failed first try: ready anyway
        assert not held.can_hold() or len(tries) >= 2
        await eventually(lambda: held.listening, timeout=20)
        assert len(tries) == 2 and held.can_hold()
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        await store.close()
