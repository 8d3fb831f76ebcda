"""Relays share the shards by fenced leases: fencing of acks, rebalancing, takeover of a
relay that died.

The takeover test runs on one Redis server and on the Redis Cluster shared by the run; the
lease-level tests use the single server (the scripts are the same on both).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator

import httpx
import pytest

from baton.brain.worker import BrainWorker
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.devkit.redis_cluster import RedisClusterServers
from baton.devkit.redis_cluster import _client as redis_cluster_client
from baton.examples.notices import app
from baton.hands.worker import HandsWorker
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.epoch import StoreEpoch
from baton.store.keys import Keys
from baton.store.outbox import LeaseAnswer, Outbox
from baton.store.store import Store
from tests.conftest import TOPOLOGIES
from tests.helpers import eventually

SESSIONS = 4


def notice(n: int) -> str:
    to = ", ".join(f"r{n}-{i}@example.com" for i in range(5))
    return f"Send the approved notice to {to}, then summarise."


@pytest.fixture
async def mailbox() -> AsyncIterator[MailboxServer]:
    async with MailboxServer(delay_ms=100) as server:  # mails in flight when a relay dies
        yield server


@contextlib.asynccontextmanager
async def shard_with_a_row(settings: Settings, shard: int) -> AsyncIterator[
        tuple[Store, Keys, Outbox]]:
    """A store whose outbox shard ``shard`` has its group and one row, ``row-1``."""
    store = await Store.connect(settings)
    try:
        keys = Keys(settings.namespace, settings.shards)
        box = Outbox(store.redis, keys)
        await box.ensure_groups([shard])
        await store.redis.xadd(keys.outbox(shard), {"id": "row-1", "subj": "x", "data": "{}"})
        yield store, keys, box
    finally:
        await store.close()


async def test_a_relay_that_lost_its_shard_cannot_acknowledge_its_rows(settings: Settings) -> None:
    async with shard_with_a_row(settings, 3) as (store, keys, box):
        a = await box.lease("acquire", 3, "relay-a", 200)
        assert a.ok and not (await box.lease("acquire", 3, "relay-b", 200)).ok
        rows = await box.read([3], "relay-a", 10, None)
        assert [r.id for r in rows] == ["row-1"]

        async def taken() -> int:
            answer = await box.lease("acquire", 3, "relay-b", 60_000)
            return answer.fence if answer.ok else 0

        b_fence = await eventually(taken, timeout=30, message="the expired lease is taken")
        assert b_fence == a.fence + 1
        # relay-a published the row but lost the shard: its ack deletes nothing.
        assert await box.ack(rows, "relay-a", {3: a.fence}) == {3: "relay-b"}
        assert await store.redis.xlen(keys.outbox(3)) == 1
        assert not (await box.lease("renew", 3, "relay-a", 200, a.fence)).ok
        # The new holder claims the row (same id: the same Nats-Msg-Id) and acks it.
        claimed = await box.claim_stale(3, "relay-b", 0, 10)
        assert [r.id for r in claimed] == ["row-1"]
        assert await box.ack(claimed, "relay-b", {3: b_fence}) == {}
        assert await store.redis.xlen(keys.outbox(3)) == 0


async def test_a_batch_is_acknowledged_before_the_next_read(settings: Settings) -> None:
    """ack_and_read: the published rows are acknowledged and deleted, the answer handed over
    before the read's rows come back. After the server lost its scripts the ack loads its
    script again and acknowledges (an ack of rows acknowledged already acknowledges
    nothing)."""
    async with shard_with_a_row(settings, 4) as (store, keys, box):
        a = await box.lease("acquire", 4, "relay-a", 60_000)
        rows = await box.read([4], "relay-a", 10, None)
        await store.redis.xadd(keys.outbox(4), {"id": "row-2", "subj": "x", "data": "{}"})
        answers: list[dict[int, str]] = []
        later = await box.ack_and_read(rows, "relay-a", {4: a.fence}, [4], 10, 1000,
                                       answers.append)
        assert answers == [{}] and [r.id for r in later] == ["row-2"]
        assert await store.redis.xlen(keys.outbox(4)) == 1  # row-1 deleted
        await store.redis.script_flush()
        assert await box.ack_and_read(later, "relay-a", {4: a.fence}, [4], 10, 10,
                                      answers.append) == []
        assert answers == [{}, {}]
        assert await store.redis.xlen(keys.outbox(4)) == 0
        assert await store.redis.xpending(keys.outbox(4), "relay") == {
            "pending": 0, "min": None, "max": None, "consumers": []}


async def test_one_look_tells_which_leases_a_relay_may_take(settings: Settings) -> None:
    """A relay looks at the shards it does not hold in one read-only call and tries to take
    only the free and expired ones: held leases stay untouched, their fences unchanged."""
    store = await Store.connect(settings)
    try:
        box = Outbox(store.redis, Keys(settings.namespace, settings.shards))
        held = await box.lease("acquire", 5, "relay-a", 60_000)
        dying = await box.lease("acquire", 6, "relay-a", 200)
        assert held.ok and dying.ok
        looks = await box.look([5, 6, 7])
        assert looks is not None
        assert looks[5][0] == "relay-a" and looks[5][1] > 0
        assert looks[7] == ("", 0)  # never held

        async def expired() -> bool:
            found = await box.look([6])
            return found is not None and found[6] == ("relay-a", 0)

        await eventually(expired, timeout=30, message="the short lease expired")
        assert await store.redis.hget(box.keys.relay_lease(5), "fence") == str(held.fence)
        assert (await box.lease("renew", 5, "relay-a", 60_000, held.fence)).ok
    finally:
        await store.close()


async def test_relays_rebalance_when_one_joins_and_when_it_leaves(settings: Settings) -> None:
    settings = settings.model_copy(update={"lease_ms": 600})
    first = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    second = Relay(settings.model_copy(update={"worker_name": "relay-2"}))
    one = asyncio.create_task(first.serve())
    try:
        await eventually(lambda: len(first.shards) == settings.shards, timeout=10,
                         message="a lone relay holds every shard")
        two = asyncio.create_task(second.serve())
        half = settings.shards // 2
        await eventually(lambda: len(first.shards) == half and len(second.shards) == half,
                         timeout=10, message="two relays hold half each")
        assert not set(first.shards) & set(second.shards)
        second.shutdown()  # graceful: releases its leases at once
        await two
        await eventually(lambda: len(first.shards) == settings.shards, timeout=10,
                         message="the remaining relay takes the released shards")
    finally:
        first.shutdown()
        second.shutdown()
        await asyncio.gather(one, return_exceptions=True)


async def test_a_relay_holding_every_shard_renews_every_half_lease_and_keeps_them(
        settings: Settings) -> None:
    """Alone, a relay has no other relay's shard to look at: it ticks every half lease, and
    its renewals keep every lease (fences unchanged, nothing lost); once another relay holds
    shards it ticks every third of the lease again, to see theirs lapse."""
    # A lease long enough that a loaded machine's stall does not outlast a renewal's margin
    # (half the lease: 1.2 s leases lapsed under two busy processes beside the suite).
    settings = settings.model_copy(update={"lease_ms": 3000, "worker_name": "relay-1"})
    relay = Relay(settings)
    task = asyncio.create_task(relay.serve())
    try:
        await eventually(lambda: len(relay.shards) == settings.shards, timeout=10,
                         message="a lone relay holds every shard")
        leases = relay.leases
        assert leases is not None
        assert leases.next_tick_s() == pytest.approx(settings.lease_ms / 2000)
        fences = dict(leases.held)
        renewals: list[int] = []
        renew_all = leases.box.renew_all

        async def counted(held: dict[int, int], holder: str, ttl_ms: int,
                          failed: dict[int, Exception] | None = None
                          ) -> dict[int, LeaseAnswer]:
            renewals.append(len(held))
            return await renew_all(held, holder, ttl_ms, failed)

        leases.box.renew_all = counted  # type: ignore[method-assign]
        await eventually(lambda: len(renewals) >= 4, timeout=30,
                         message="four renewals, two lease times")
        assert dict(leases.held) == fences  # never lapsed: the same fences, none lost
        # Another relay holds a shard: this one ticks every third of the lease again.
        shard = max(fences)

        async def taken_by_another() -> bool:
            if shard in leases.held:
                await leases.release(shard)
            return (await leases.box.lease("acquire", shard, "relay-2", 60_000)).ok

        await eventually(taken_by_another, timeout=10, message="another relay took a shard")
        assert shard not in leases.held
        assert leases.next_tick_s() == pytest.approx(settings.lease_ms / 3000)
    finally:
        relay.shutdown()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.slow
@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_three_relays_one_killed_its_shards_are_taken_over_and_nothing_is_lost(
    topology: str, topo_settings: Settings, mailbox: MailboxServer
) -> None:
    settings = topo_settings.model_copy(update={
        "mail_url": mailbox.url, "lease_ms": 1000, "relay_claim_idle_ms": 500,
        "attempt_ttl_ms": 1500, "ack_wait_s": 3.0, "progress_deadline_ms": 4000})

    def named(name: str) -> Settings:
        return settings.model_copy(update={"worker_name": name})

    relays = [Relay(named(f"relay-{i}")) for i in range(3)]
    workers = [HandsWorker(named("hands-1"), app), BrainWorker(named("brain-1"), app)]
    tasks = {s: asyncio.create_task(s.serve()) for s in [*relays, *workers]}
    client = await Client.connect(settings)
    try:
        await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in tasks)), 60)
        await eventually(lambda: all(r.shards for r in relays)
                         and sum(len(r.shards) for r in relays) == settings.shards,
                         timeout=15, message="three relays share the shards")
        subs = [(await client.submit(notice(n), agent="notices"))[0] for n in range(SESSIONS)]
        await eventually(lambda: mailbox.operations, timeout=20, message="mail being sent")
        victim, survivors = relays[0], relays[1:]
        lost = set(victim.shards)

        async def keep_leases() -> None:  # dies without releasing: they must expire
            return None

        assert victim.leases is not None
        victim.leases.release_all = keep_leases  # type: ignore[method-assign]
        tasks[victim].cancel()
        ended, _ = await asyncio.wait({tasks[victim]}, timeout=20)
        assert ended, "a cancelled relay must end"
        await eventually(
            lambda: set().union(*(r.shards for r in survivors)) == set(range(settings.shards)),
            timeout=15, message="the dead relay's shards are taken over")
        finals = await asyncio.gather(*(client.wait(s, timeout=60) for s in subs))
    finally:
        await client.close()
        for s in tasks:
            s.shutdown()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    assert [f.status for f in finals] == ["completed"] * SESSIONS, finals
    assert all(f.answer and f.answer.count(": sent") == 5 for f in finals)
    assert lost  # the victim held shards, which the survivors took (waited on above)
    async with httpx.AsyncClient() as http:
        stats = (await http.get(f"{mailbox.url}/stats")).json()
    # One mail per recipient, each sent once: no row was acted on twice.
    deliveries = Counter(stats["deliveries"])
    assert len(deliveries) == 5 * SESSIONS and set(deliveries.values()) == {1}, deliveries
    assert stats["raw_requests"] == 5 * SESSIONS, stats


async def test_a_primary_refusing_writes_stalls_only_its_own_shards(
        redis_cluster: RedisClusterServers, settings: Settings) -> None:
    """On a Redis Cluster, one primary refusing writes (its replica gone, under
    min-replicas-to-write) fails the lease calls of its own shards only: the relay renews the
    others and keeps them. The first refusal ended the whole tick, so the healthy
    primaries' shards lapsed too."""
    from baton.relay.leases import ShardLeases

    settings = settings.model_copy(update={"redis_url": redis_cluster.seed_url})
    keys = Keys(settings.namespace, settings.shards)
    store = await Store.connect(settings)
    leases = ShardLeases(Outbox(store.redis, keys), "relay-1", settings.shards, 60_000)
    sick = await redis_cluster.primary_for_key(keys.relay_lease(0))
    admin = redis_cluster_client(sick)
    try:
        await leases.tick(0)
        assert len(leases.held) == settings.shards  # alone: every shard
        fences = dict(leases.held)
        ours = {s for s in fences
                if await redis_cluster.primary_for_key(keys.relay_lease(s)) == sick}
        await admin.config_set("min-replicas-to-write", "9")  # it refuses every write now
        try:
            await leases.tick(1)  # does not raise: the other primaries answered
            until = {s: int(await store.redis.hget(keys.relay_lease(s), "until") or 0)
                     for s in fences if s not in ours}
            await leases.tick(2)
            renewed = {s: int(await store.redis.hget(keys.relay_lease(s), "until") or 0)
                       for s in until}
        finally:
            await admin.config_set("min-replicas-to-write", "0")
        assert ours and len(ours) < settings.shards
        assert all(renewed[s] >= until[s] for s in until)  # renewed, by the Redis clock
        assert dict(leases.held) == fences  # nothing lost, nothing given up
    finally:
        await leases.release_all()
        await admin.aclose()
        await store.close()


async def test_the_shards_of_a_relay_that_died_are_not_left_free(settings: Settings) -> None:
    """Three relays share the shards; one dies without releasing its leases. The survivors
    take its lapsed shards and keep them while the registry still announces it alive (they
    released them again as surplus at once, and the shards lay free 4 to 8 s, every relay
    being at a share that still counted the dead one). Once the registry has noticed, the
    shares grow and the surplus moves over with no shard left free."""
    from baton.relay.leases import ShardLeases
    from baton.store.workers import SERVICE_STALE_MS

    keys = Keys(settings.namespace, settings.shards)
    store = await Store.connect(settings)
    box = Outbox(store.redis, keys)
    # Leases that outlast any stall of a loaded machine; the relay that dies renews its own
    # for 300 ms last, so they lapse soon after.
    relays = {name: ShardLeases(box, name, settings.shards, 60_000)
              for name in ("relay-a", "relay-b", "relay-c")}

    async def round_of_ticks(now_ms: int, live: int) -> set[int]:
        for lease in relays.values():
            lease._live, lease._counted_ms = live, now_ms  # what the registry says
            await lease.tick(now_ms)
        return set().union(*(x.held for x in relays.values()))

    try:
        async def shared_out() -> bool:
            await round_of_ticks(1, 3)
            return all(x.held for x in relays.values())
        await eventually(shared_out, timeout=10, message="the shards shared three ways")
        dead = relays.pop("relay-c")
        dead.ttl_ms = 300
        await dead.tick(1)  # its last renewal
        orphaned = set(dead.held)  # it dies holding them: no release

        async def all_held_again() -> bool:
            return await round_of_ticks(1, 3) == set(range(settings.shards))
        await eventually(all_held_again, timeout=30, message="the dead relay's shards taken")
        for _ in range(3):  # the registry still counts the dead relay: nothing is let go
            assert await round_of_ticks(1, 3) == set(range(settings.shards))
        assert orphaned <= set().union(*(x.held for x in relays.values()))
        later = 1 + SERVICE_STALE_MS  # the registry has noticed: two live relays
        left_free: set[int] = set()
        for _ in range(4):  # the surplus moves over: a shard released is taken next tick
            free = set(range(settings.shards)) - await round_of_ticks(later, 2)
            assert not free & left_free, f"shards {free & left_free} free for a whole round"
            left_free = free
        assert not left_free
        assert sorted(len(x.held) for x in relays.values()) == [8, 8]
    finally:
        for lease in relays.values():
            await lease.release_all()
        await store.close()


async def test_a_relay_starts_while_a_primary_refuses_writes(
        redis_cluster: RedisClusterServers, settings: Settings) -> None:
    """A relay (re)started while one Redis Cluster primary refuses writes (its replica
    gone): it serves the other primaries' shards, and takes the rest once that primary
    accepts writes again. Creating every shard's consumer group at start failed on that
    primary and the relay retried its start for good."""
    settings = settings.model_copy(update={"redis_url": redis_cluster.seed_url,
                                           "worker_name": "relay-1", "lease_ms": 1500})
    keys = Keys(settings.namespace, settings.shards)
    sick = await redis_cluster.primary_for_key(keys.relay_lease(0))
    theirs = {s for s in range(settings.shards)
              if await redis_cluster.primary_for_key(keys.relay_lease(s)) == sick}
    admin = redis_cluster_client(sick)
    relay = Relay(settings)
    task: asyncio.Task[None] | None = None
    store = await Store.connect(settings)  # a store in use: its epoch written
    try:
        await StoreEpoch.establish(store.redis, keys)
    finally:
        await store.close()
    await admin.config_set("min-replicas-to-write", "9")  # it refuses every write now
    try:
        task = asyncio.create_task(relay.serve())
        await eventually(lambda: set(relay.shards) == set(range(settings.shards)) - theirs,
                         timeout=30, message="the healthy primaries' shards served")
        await admin.config_set("min-replicas-to-write", "0")
        await eventually(lambda: len(relay.shards) == settings.shards, timeout=30,
                         message="every shard once the primary takes writes")
    finally:
        await admin.config_set("min-replicas-to-write", "0")
        await admin.aclose()
        relay.shutdown()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
