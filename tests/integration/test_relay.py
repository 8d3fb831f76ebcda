"""The relay against real redis-server and nats-server: publish, takeover, timers, failures."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable

import pytest
from nats.aio.msg import Msg
from nats.js.api import RawStreamMsg
from redis.asyncio import Redis

from baton.bus.bus import Bus, Puller
from baton.bus.messages import Outgoing
from baton.devkit.servers import NatsServer, RedisServer
from baton.models import OutboxRow, Task, dumps, loads
from baton.relay.publisher import Publisher
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.deadletter import dead_letters, record_dead_letter
from baton.store.keys import Keys
from baton.store.outbox import Outbox
from baton.store.redis_client import connect_redis
from baton.store.store import Store, now_ms, worker_ref
from baton.store.writes import Writes, timer_member
from tests.conftest import TOPOLOGIES
from tests.helpers import eventually, take_up

BRAIN = worker_ref("brain", "brain-a")
AGENT, COMPAT, TOOL = "notices", 1, "send_email"


@contextlib.asynccontextmanager
async def running(settings: Settings, **overrides: object) -> AsyncIterator[Relay]:
    """A relay serving in this event loop; shut down (gracefully) and awaited on exit."""
    relay = Relay(settings.model_copy(update=overrides))
    task = asyncio.create_task(relay.serve())
    ready = asyncio.create_task(relay.ready.wait())
    try:
        await asyncio.wait({task, ready}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # serve() failed: raise its error
        assert relay.ready.is_set(), "relay not ready within 10s"
        yield relay
    finally:
        ready.cancel()
        relay.shutdown()
        async with asyncio.timeout(10):
            await task


@contextlib.asynccontextmanager
async def connected(settings: Settings) -> AsyncIterator[Store]:
    store = await Store.connect(settings)
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[Store]:
    async with connected(settings) as store:
        yield store


@pytest.fixture
async def bus(settings: Settings) -> AsyncIterator[Bus]:
    async with await Bus.connect(settings, "test") as bus:
        await bus.ensure_streams()
        yield bus


async def wake_puller(bus: Bus) -> Puller:
    durable = bus.names.wake_durable(AGENT, COMPAT)
    await bus.ensure_consumer(bus.names.wake_stream, durable, bus.wake_subject(AGENT, COMPAT))
    return await bus.pull(bus.names.wake_stream, durable)


async def tool_puller(bus: Bus) -> Puller:
    durable = bus.names.tool_durable(TOOL)
    await bus.ensure_consumer(bus.names.tool_stream, durable, bus.tool_subject(TOOL))
    return await bus.pull(bus.names.tool_stream, durable)


async def collect(puller: Puller, n: int, timeout: float = 10.0) -> list[Msg]:  # noqa: ASYNC109
    """Exactly ``n`` messages (acked), waiting on JetStream fetches up to ``timeout`` in all."""
    msgs: list[Msg] = []
    async with asyncio.timeout(timeout):
        while len(msgs) < n:
            for msg in await puller.fetch(n - len(msgs), timeout=1.0):
                await msg.ack()
                msgs.append(msg)
    return msgs


async def stream_messages(bus: Bus, stream: str) -> list[RawStreamMsg]:
    """Every message the stream holds (unconsumed), in order."""
    js = bus.nc.jetstream()
    state = (await js.stream_info(stream)).state
    if not state.messages:
        return []
    return [await js.get_msg(stream, seq) for seq in range(state.first_seq, state.last_seq + 1)]


def msg_ids(msgs: list[RawStreamMsg] | list[Msg]) -> list[str]:
    return [(m.headers or {})["Nats-Msg-Id"] for m in msgs]


async def backlog(store: Store) -> int:
    return sum(b.rows for b in await Outbox(store.redis, store.keys).backlog())


async def drained(store: Store) -> bool:
    return await backlog(store) == 0


async def open_session(store: Store, bus: Bus, sid: str) -> int:
    """Submit (one wake row "<sid>/0/s.r1"), take it up as a Brain and take the lease;
    returns the fence."""
    await store.inbox.submit(
        sid, agent=AGENT, compat=COMPAT, wake_subject=bus.wake_subject(AGENT, COMPAT),
        request_id="r1", text="hi", task=Task(id="task-1", kind="generation", owner=sid),
        worker=worker_ref("client", "c"), submission_id="sub-1",
    )
    await take_up(store, sid, BRAIN)
    return (await store.acquire(sid, BRAIN, 5_000)).fence


async def test_committed_rows_are_published_with_row_ids_then_removed(
    store: Store, bus: Bus, settings: Settings
) -> None:
    wakes, tools = await wake_puller(bus), await tool_puller(bus)
    fence = await open_session(store, bus, "s1")
    dispatch = dumps({"v": 1, "session_id": "s1", "run_id": "run-1", "tool": TOOL})
    rows = [
        OutboxRow(subject=bus.tool_subject(TOOL), data=dispatch, headers={"traceparent": "00-x"}),
        OutboxRow(subject=bus.wake_subject(AGENT, COMPAT), data=dumps({"session_id": "s1"})),
    ]
    seq, _ = await store.commit("s1", fence, Writes(outbox=rows), BRAIN)
    assert await backlog(store) == 3

    async with running(settings) as relay:
        tool_msgs = await collect(tools, 1)
        wake_msgs = await collect(wakes, 2)
        await eventually(lambda: drained(store), message="outbox drained")
    assert msg_ids(tool_msgs) == [f"s1/{seq}/0"]
    assert tool_msgs[0].data.decode() == dispatch
    assert tool_msgs[0].headers["traceparent"] == "00-x"  # type: ignore[index]
    assert sorted(msg_ids(wake_msgs)) == sorted(["s1/0/s.r1", f"s1/{seq}/1"])
    counts = relay.counts
    assert counts.published == 3 and counts.duplicates == 0 and counts.dead_lettered == 0


async def test_live_relay_takes_over_rows_of_a_dead_relay_and_dedupes(
    store: Store, bus: Bus, settings: Settings
) -> None:
    for i in range(5):
        await open_session(store, bus, f"s{i}")
    box = Outbox(store.redis, store.keys)
    await box.ensure_groups()
    taken = await box.read(list(range(settings.shards)), "dead-relay", 100, None)
    assert len(taken) == 5
    # The dead relay had published one row before it died (relay.after_publish).
    await bus.publish_many([Outgoing(taken[0].subject, taken[0].data.encode(), taken[0].id)])

    async with running(settings, relay_claim_idle_ms=200) as relay:
        await eventually(lambda: drained(store), message="rows taken over")
    assert relay.counts.claimed == 5
    assert relay.counts.published == 4 and relay.counts.duplicates == 1
    stored = await stream_messages(bus, bus.names.wake_stream)
    assert sorted(msg_ids(stored)) == sorted(r.id for r in taken)  # one message per row id


async def test_due_timers_fire_as_wakes_and_deadlines_rearm(
    bus: Bus, settings: Settings
) -> None:
    settings = settings.model_copy(update={"progress_deadline_ms": 300})
    wake = bus.wake_subject(AGENT, COMPAT)
    wakes = await wake_puller(bus)
    reasons: list[str] = []
    async with connected(settings) as store:  # submit arms a 300 ms session deadline
        fence = await open_session(store, bus, "s1")
        member = timer_member("task", "s1", "t1", wake)
        await store.commit("s1", fence, Writes(timers_add={member: now_ms()}), BRAIN)

        async with running(settings) as relay:
            async with asyncio.timeout(10):
                # the request's wake travels on the wakes stream, read apart from the
                # timers: on a loaded machine two deadlines may come first
                while reasons.count("timer:deadline") < 2 or "submit" not in reasons:
                    reasons += [loads(m.data)["reason"] for m in await collect(wakes, 1)]
                    # as a Brain's lease, taking the wake up: a deadline whose last wake
                    # waits untaken sends no other (fire_timers.lua)
                    await store.redis.delete(store.keys.session("s1").nudge)
        deadline = timer_member("deadline", "s1", "-", wake)
        armed = await store.redis.zscore(store.keys.session("s1").timers, deadline)
    assert reasons.count("submit") == 1  # the request's wake (wakes stream: any order)
    assert reasons.count("timer:task") == 1  # a one-shot timer fires once
    assert relay.counts.timers_fired >= 3
    assert armed is not None  # a deadline stays armed until a commit clears it


async def test_rows_wait_in_the_outbox_while_nats_is_down(
    store: Store, settings: Settings
) -> None:
    # Memory streams vanish with the server: after the restart the relay must re-create
    # them itself, which is the harder case (a file store would keep them).
    async with NatsServer() as nats:
        settings = settings.model_copy(
            update={"nats_url": nats.url, "stream_storage": "memory"}
        )
        async with running(settings) as relay, await Bus.connect(settings, "t") as bus:
            nats.kill()
            await eventually(lambda: relay.bus is not None and not relay.bus.nc.is_connected)
            for i in range(3):
                await open_session(store, bus, f"s{i}")
            await eventually(lambda: relay.counts.retries >= 2, message="relay retried")
            assert await backlog(store) == 3 and relay.counts.published == 0  # nothing lost

            await nats.restart()
            await eventually(lambda: drained(store), timeout=15, message="drained")
            await eventually(lambda: bus.nc.is_connected)
            stored = await stream_messages(bus, bus.names.wake_stream)
        assert sorted(msg_ids(stored)) == ["s0/0/s.r1", "s1/0/s.r1", "s2/0/s.r1"]
        assert relay.counts.published == 3


async def test_relay_survives_a_redis_restart_without_persistence(
    bus: Bus, settings: Settings
) -> None:
    wakes = await wake_puller(bus)
    async with RedisServer() as redis_server:
        settings = settings.model_copy(update={"redis_url": redis_server.url})
        async with running(settings) as relay:
            async with connected(settings) as store:
                await open_session(store, bus, "before")
                assert msg_ids(await collect(wakes, 1)) == ["before/0/s.r1"]
                # The store's epoch is put back after the restart (as an operator restoring
                # the store would): the relay's epoch check, which runs when rows arrive
                # after an idle spell, would otherwise rightly stop it (its store came back
                # empty), and this test is about the groups and scripts it recreates.
                names = [store.keys.epoch(shard) for shard in range(store.keys.shards)]
                epoch = dict(zip(names, await store.redis.mget(names), strict=True))

            await redis_server.restart()  # data, consumer groups and scripts are gone
            raw = connect_redis(settings)
            try:
                await raw.mset(epoch)
            finally:
                await raw.aclose()
            async with connected(settings) as store:
                await open_session(store, bus, "after")
                assert msg_ids(await collect(wakes, 1)) == ["after/0/s.r1"]
    assert relay.counts.retries >= 1


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_relay_rides_out_its_blocked_read_cut_off(
    topology: str, topo_settings: Settings, bus: Bus, request: pytest.FixtureRequest
) -> None:
    """The server drops the relay's blocked XREADGROUP connection (as a restart or a
    network cut would): the relay retries, on one server and on a cluster, and goes on."""
    if topology == "cluster":
        urls = [f"redis://{n.address}" for n in request.getfixturevalue("redis_cluster").nodes]
    else:
        urls = [request.getfixturevalue("redis_server").url]
    wakes = await wake_puller(bus)
    async with running(topo_settings) as relay, connected(topo_settings) as store:
        await open_session(store, bus, "before")
        assert msg_ids(await collect(wakes, 1)) == ["before/0/s.r1"]

        async def cut_blocked_reads() -> bool:
            cut = 0
            for url in urls:
                node = Redis.from_url(url, decode_responses=True)
                try:
                    for client in await node.client_list():
                        if client["cmd"] == "xreadgroup" and "b" in client["flags"]:
                            cut += await node.client_kill_filter(_id=client["id"])
                finally:
                    await node.aclose()
            return cut > 0

        async def cut_until_retried() -> bool:
            # Cut again until the relay noticed: a blocked read seen in CLIENT LIST may be
            # another client's, or this relay's just as it ended that read on its own.
            if relay.counts.retries >= 1:
                return True
            await cut_blocked_reads()
            return relay.counts.retries >= 1

        await eventually(cut_until_retried, interval=0.2,
                         message="the relay's blocked read was cut and the relay retried")
        await open_session(store, bus, "after")
        assert msg_ids(await collect(wakes, 1)) == ["after/0/s.r1"]
        assert not relay.stopping.is_set()


async def test_poison_rows_become_dead_letters_and_do_not_block(
    settings: Settings, bus: Bus
) -> None:
    settings = settings.model_copy(update={"max_payload_bytes": 1024})
    async with connected(settings) as store:
        wakes = await wake_puller(bus)
        await open_session(store, bus, "s1")
        key = store.keys.outbox(store.keys.shard_of("s1"))
        wake = bus.wake_subject(AGENT, COMPAT)

        def row(rid: str, subject: str, data: str, **extra: str) -> dict[str, str]:
            return {"id": rid, "subj": subject, "data": data, "hdr": "", "sid": "s1",
                    "ts": "0", **extra}

        await store.redis.xadd(key, row("p/1", "bad subject with spaces", "{}"))
        await store.redis.xadd(key, row("p/2", wake, "x" * 2000))
        await store.redis.xadd(key, row("p/3", wake, "x" * 1000))  # too large with headers
        await store.redis.xadd(key, {"id": "p/4", "data": "{}"})  # malformed: no subject
        await store.redis.xadd(key, row("p/5", "other.wake.a.1", "{}"))  # no stream of ours
        await store.redis.xadd(key, row("s1/9/0", wake, dumps({"session_id": "s1"})))

        async with running(settings) as relay:
            got = await collect(wakes, 2)
            await eventually(lambda: drained(store), message="outbox drained")
        assert sorted(msg_ids(got)) == ["s1/0/s.r1", "s1/9/0"]
        assert relay.counts.dead_lettered == 5
        dead = {d["row_id"]: d for d in await dead_letters(store.redis, store.keys)}
        assert set(dead) == {"p/1", "p/2", "p/3", "p/4", "p/5"}
        assert "invalid subject" in dead["p/1"]["reason"]
        assert "exceeds 1024" in dead["p/2"]["reason"]
        assert "exceeds 1024" in dead["p/3"]["reason"]
        assert "malformed" in dead["p/4"]["reason"]
        assert dead["p/2"]["source"] == "relay" and len(dead["p/2"]["payload"]) == 2000


async def test_a_row_refused_by_the_server_is_isolated_and_dead_lettered(
    store: Store, bus: Bus, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Should the relay's own checks miss a limit, the server's refusal must still not block
    # the shard: the failed batch is retried row by row and the refused row dead-lettered.
    # (nats-py reports a refused async publish only as a timeout, so this test takes ~5 s.)
    monkeypatch.setattr(Publisher, "refusal", lambda self, row: None)
    wakes = await wake_puller(bus)
    wake = bus.wake_subject(AGENT, COMPAT)
    fence = await open_session(store, bus, "s1")
    rows = [OutboxRow(subject=wake, data="x" * 1000), OutboxRow(subject=wake, data="{}")]
    await store.commit("s1", fence, Writes(outbox=rows), BRAIN)

    # The relay's streams get max_msg_size 1024: the first row exceeds it with its headers.
    async with running(settings, max_payload_bytes=1024) as relay:
        got = await collect(wakes, 2, timeout=20)
        await eventually(lambda: drained(store), timeout=10, message="outbox drained")
    [dead] = await dead_letters(store.redis, store.keys)
    assert sorted(msg_ids(got)) == ["s1/0/s.r1", "s1/2/1"]
    assert relay.counts.dead_lettered == 1
    # Refused by the bus's own size check (headers counted) or, failing that, by the server.
    assert dead["row_id"] == "s1/2/0"
    assert "10054" in dead["reason"] or "exceeds 1024" in dead["reason"]


async def test_two_relays_publish_every_row_exactly_once(
    bus: Bus, settings: Settings
) -> None:
    settings = settings.model_copy(update={"shards": 4})
    async with connected(settings) as store:
        async with running(settings, worker_name="relay-a") as a, running(
            settings, worker_name="relay-b"
        ) as b:
            await asyncio.gather(*(open_session(store, bus, f"s{i}") for i in range(60)))
            await eventually(lambda: drained(store), message="outbox drained")
        stored = await stream_messages(bus, bus.names.wake_stream)
        assert sorted(msg_ids(stored)) == sorted(f"s{i}/0/s.r1" for i in range(60))
        assert a.counts.published + b.counts.published == 60
        assert a.counts.duplicates + b.counts.duplicates == 0


async def test_dead_letters_are_capped_truncated_and_newest_first(
    store: Store, redis: object
) -> None:
    keys: Keys = store.keys
    await record_dead_letter(store.redis, keys, role="brain", source="wake", reason="first",
                             payload=b"\xff1")
    await record_dead_letter(
        store.redis, keys, role="hands", source="tool", reason="second", payload="y" * 10_000,
        run_id="r1", attempt=2,
    )
    newest, oldest = await dead_letters(redis, keys)  # type: ignore[arg-type]  # bytes client
    assert newest["reason"] == "second" and newest["run_id"] == "r1" and newest["attempt"] == "2"
    assert len(newest["payload"]) == 4096 and newest["size"] == "10000"
    assert oldest["payload"] == "\ufffd1" and oldest["source"] == "wake"
    assert int(oldest["ts"]) <= int(newest["ts"])


async def test_a_wakes_stream_row_goes_out_only_on_its_sessions_wake_subject(
    settings: Settings, bus: Bus
) -> None:
    """The wakes stream (written by Hands) can wake a session on the subject that session
    committed and nothing else: a tool subject, another agent's wake subject or an unknown
    session is dead-lettered, never published."""
    async with connected(settings) as store:
        wakes = await wake_puller(bus)
        await open_session(store, bus, "s1")
        key = store.keys.session("s1").wakes
        wake = bus.wake_subject(AGENT, COMPAT)

        def row(rid: str, subject: str, sid: str = "s1") -> dict[str, str]:
            return {"id": rid, "subj": subject, "data": dumps({"session_id": sid}), "hdr": "",
                    "sid": sid, "ts": "0"}

        await store.redis.xadd(key, row("w/1", bus.tool_subject(TOOL)))
        await store.redis.xadd(key, row("w/2", bus.wake_subject("other", 1)))
        await store.redis.xadd(key, row("w/3", wake, sid="no-such-session"))
        await store.redis.xadd(key, row("s1/1/w.run-1.1", wake))

        async with running(settings) as relay:
            got = await collect(wakes, 2)  # the submit's wake and the good row
            await eventually(lambda: drained(store), message="outbox and wakes drained")
        assert sorted(msg_ids(got)) == ["s1/0/s.r1", "s1/1/w.run-1.1"]
        assert await stream_messages(bus, bus.names.tool_stream) == []
        assert relay.counts.dead_lettered == 3
        dead = {d["row_id"]: d["reason"] for d in await dead_letters(store.redis, store.keys)}
        assert set(dead) == {"w/1", "w/2", "w/3"}
        assert "unknown session" in dead["w/3"] and "wakes on" in dead["w/1"]


async def test_a_submitted_session_is_listed_once_its_wake_is_published(
    settings: Settings, bus: Bus
) -> None:
    """A client writes no session index: the relay lists the session a submit may open when
    it acknowledges the published wake (the same round trip), also for an agent level no
    Brain serves, so ``inspect`` shows the request waiting; a forged opening row for a
    session with no request is dead-lettered and listed nowhere. (The relay's inbox sweep
    lists waiting sessions too, but only every ``relay_sweep_ms``: here after the submits
    only through the acknowledgement.)"""
    async with connected(settings) as store, running(settings, relay_sweep_ms=3_600_000) as relay:
        # The sweep of the shards just taken is done (all of them).
        await eventually(lambda: relay.timers.swept == frozenset(range(settings.shards)),
                         message="shards swept")
        for sid, agent in (("listed-1", AGENT), ("listed-2", "ghost")):
            await store.inbox.submit(
                sid, agent=agent, compat=COMPAT, wake_subject=bus.wake_subject(agent, COMPAT),
                request_id="r1", text="hi", task=Task(id="task-1", kind="generation", owner=sid),
                worker=worker_ref("client", "c"), submission_id="sub-1")
        forged = store.keys.session("forged")
        await store.redis.xadd(forged.wakes, {
            "id": "forged/0/s.r9", "subj": bus.wake_subject(AGENT, COMPAT),
            "data": dumps({"session_id": "forged"}), "hdr": "", "sid": "forged", "ts": "0"})

        def listed(sid: str) -> Awaitable[float | None]:
            return store.redis.zscore(store.keys.sessions(store.keys.session(sid).shard), sid)

        await eventually(lambda: drained(store), message="wakes published and acked")
        assert await listed("listed-1") is not None and await listed("listed-2") is not None
        assert await listed("forged") is None
        assert relay.counts.published == 2 and relay.counts.dead_lettered == 1
        assert await store.redis.hlen(store.keys.session("listed-2").meta) == 0  # not opened
