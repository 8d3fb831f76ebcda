"""Scripts while a Redis Cluster slot migrates: whole transitions, on one node, or none.

Resharding (``redis-cli --cluster reshard``, adding a primary) moves a slot's keys a few at a
time with ``MIGRATE`` while the slot is ``MIGRATING`` on its old primary and ``IMPORTING`` on
the new one. Redis redirects a call by the keys it declares: the old node answers ``ASK`` when
one is gone, the new node runs it only when it has every declared key (``TRYAGAIN`` else). A
session script that declared one key and found the others by name ran on whichever node held
that one key and touched the rest where they were not: on the old node it failed at the first
key that had moved, after its first writes; on the new one it read the keys still on the old
node as empty and created new ones there, which the migration then refused to overwrite
(``BUSYKEY``). Every script now declares every key it touches (scripts.script_keys), so a
session split between two nodes is refused whole until its slot has moved.

The load test (``test_sessions_complete_while_their_slots_move``) reshards with the real
``redis-cli --cluster reshard`` while five-notice sessions, timers and relays run.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot
from redis.exceptions import ResponseError

from baton.brain.worker import BrainWorker
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.devkit.redis_cluster import RedisClusterNode, RedisClusterServers
from baton.devkit.reshard import move_slot, shard_slots
from baton.devkit.servers import NatsServer
from baton.errors import RedisUnavailable
from baton.examples.notices import app
from baton.hands.worker import HandsWorker
from baton.models import Submission
from baton.receipts import CompleteDetail, id_order
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.keys import Keys, SessionKeys
from baton.store.store import Store, worker_ref
from tests.helpers import eventually, running
from tests.integration.test_replica_ack import frozen
from tests.integration.test_store import submit

pytestmark = pytest.mark.slow

BRAIN = worker_ref("brain", "brain-reshard")


@pytest.fixture(scope="module")
async def cluster() -> AsyncIterator[RedisClusterServers]:
    async with RedisClusterServers(node_timeout_ms=5_000) as servers:
        yield servers


def _node(node: RedisClusterNode) -> Redis:
    host, port = node.address.rsplit(":", 1)
    return Redis(host=host, port=int(port), single_connection_client=True)


async def _node_ids(cluster: RedisClusterServers) -> dict[int, str]:
    return {info.port: info.node_id for info in await cluster.topology()}


async def _refusals(node: Redis) -> int:
    """TRYAGAIN and ASK replies the node gave so far (``INFO errorstats``)."""
    stats = await node.info("errorstats")
    return sum(int(v["count"]) for k, v in stats.items()
               if k in ("errorstat_TRYAGAIN", "errorstat_ASK"))


async def _contents(node: Redis, keys: list[str]) -> dict[str, Any]:
    """The keys' values as the node holds them (ASKING: the node may be importing them)."""
    out = {}
    for k in keys:
        await node.execute_command("ASKING")
        out[k] = await node.execute_command("DUMP", k)
    return out


async def _finish(src: Redis, dst: Redis, others: list[Redis], slot: int, target: str,
                  host: str, port: int) -> None:
    """Move the slot's remaining keys and give the slot to the target everywhere, as
    ``redis-cli --cluster reshard`` does after its MIGRATE batches."""
    while keys := await src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
        # No REPLACE: a key the target already has is a BUSYKEY error, the split this
        # test exists to catch.
        await src.execute_command("MIGRATE", host, port, "", 0, 5000, "KEYS", *keys)
    for node in (dst, src, *others):
        await node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target)


# renew: not acknowledged by a replica, so redis-py follows the ASK to the importing node,
# where the old scripts ran with the keys still on the old primary read as empty.
async def _receipt_ids(r: Any, sk: SessionKeys, present: list[Any] | None = None) -> list[str]:
    """The ids of the session's receipts, every role's stream merged in order; ``present``:
    the keys the node holds (a node migrating the slot redirects a read of another)."""
    held = None if present is None else {k.decode() if isinstance(k, bytes) else k
                                         for k in present}
    ids = [i.decode() if isinstance(i, bytes) else i
           for _, key in sk.receipt_streams() if held is None or key in held
           for i, _ in await r.xrange(key)]
    return sorted(ids, key=id_order)


@pytest.mark.parametrize("transition", ["acquire", "submit", "renew"])
async def test_a_session_split_by_a_migrating_slot_is_refused_whole_until_the_slot_moved(
    cluster: RedisClusterServers, transition: str,
) -> None:
    settings = Settings(redis_url=cluster.seed_url, namespace=f"split-{transition}")
    store = await Store.connect(settings)
    session = f"s-{transition}"
    try:
        await submit(store, session)  # an open session: meta, entries, receipts, ...
        fence = (await store.acquire(session, BRAIN, 60_000)).fence if transition == "renew" else 0
        sk = store.keys.session(session)
        slot = key_slot(sk.meta.encode())
        source = await cluster.primary_for_slot(slot)
        primaries = {info.port for info in await cluster.topology()
                     if info.role == "primary" and info.slots}
        target = cluster.node_at(min(primaries - {source.port}))
        ids = await _node_ids(cluster)
        rest = [cluster.node_at(p) for p in primaries - {source.port, target.port}]
        src, dst, others = _node(source), _node(target), [_node(n) for n in rest]
        try:
            await dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source.port])
            await src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target.port])
            # The session's meta moves first: its other keys stay on the old primary.
            host, port = target.address.rsplit(":", 1)
            await src.execute_command("MIGRATE", host, int(port), "", 0, 5000, "KEYS", sk.meta)
            session_keys = await src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
            before = (await _contents(src, session_keys), await _contents(dst, [sk.meta]))
            history = await _receipt_ids(src, sk, session_keys)
            refused = await _refusals(dst) + await _refusals(src)

            async def run() -> Any:
                if transition == "acquire":
                    return await store.acquire(session, BRAIN, 60_000)
                if transition == "renew":
                    return await store.renew(session, fence, 60_000, BRAIN)
                return await submit(store, session, "r2", take=False)

            attempt = asyncio.create_task(run())
            # Refused (ASK, then TRYAGAIN) while split: nothing ran on either node.
            await eventually(lambda: _more(src, dst, refused))
            after = (await _contents(src, session_keys), await _contents(dst, [sk.meta]))
            assert after == before
            assert await dst.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 1
            await _finish(src, dst, others, slot, ids[target.port], host, int(port))
            try:
                await attempt
            except RedisUnavailable:  # the client gave up before the slot moved: again
                await run()
        finally:
            for r in (src, dst, *others):
                await r.aclose()
        # The transition ran once, on the new primary, over the session's whole history.
        ids = await _receipt_ids(store.redis, sk)
        assert ids[:len(history)] == history  # a renewal writes no receipt, the others one
        assert len(ids) == len(history) + (transition != "renew")
        assert (await cluster.primary_for_slot(slot)).port == target.port
        if transition == "acquire":
            assert int(await store.redis.hget(sk.meta, "fence")) == 2
        elif transition == "renew":
            assert int(await store.redis.hget(sk.meta, "fence")) == fence
        else:
            assert await store.redis.hexists(sk.inbox, "submit:r2")
    finally:
        await store.close()


async def _more(src: Redis, dst: Redis, before: int) -> bool:
    return await _refusals(dst) + await _refusals(src) > before


async def test_a_move_waits_out_a_late_replica_and_one_left_half_done_is_finished(
    cluster: RedisClusterServers,
) -> None:
    """A source whose replica stopped acknowledging refuses MIGRATE (NOREPLICAS) until the
    replica is back: the move waits that out rather than leave its slot half moved, where
    every call on the sessions it splits is refused. A move that runs out of patience says
    which slot it left and how; moving the slot again finishes it with every key kept."""
    namespace = f"mv{uuid.uuid4().hex[:6]}"
    slot = shard_slots(namespace, 1)[0]
    tag = re.search(r"{[^}]+}", Keys(namespace, 1).timers(0))
    assert tag is not None
    keys = [f"{namespace}:{tag.group(0)}:k{i}" for i in range(20)]
    source = await cluster.primary_for_slot(slot)
    replica = await cluster.replica_of(source)
    primaries = sorted(i.port for i in await cluster.topology() if i.role == "primary" and i.slots)
    target = cluster.node_at(next(p for p in primaries if p != source.port))
    src = _node(source)
    try:
        for k in keys:
            await src.set(k, k)

        async def refusals() -> int:
            stats = await src.info("errorstats")
            return int(stats.get("errorstat_NOREPLICAS", {}).get("count", 0))

        async def refused_write() -> bool:
            try:
                await src.set(keys[0], keys[0])
            except ResponseError as exc:
                return str(exc).startswith("NOREPLICAS")
            return False

        with frozen(replica):
            await eventually(refused_write, message="the source never refused a write")
            with pytest.raises(RedisUnavailable, match=rf"slot {slot}: MIGRATE still refused "
                               r"\(ResponseError: NOREPLICAS.*redis-cli --cluster fix"):
                await move_slot(cluster, slot, to=target, batch=1, patience=0.5)
            nodes = await src.execute_command("CLUSTER", "NODES")
            assert f"[{slot}->-".encode() in nodes  # left MIGRATING
            before = await refusals()
            again = asyncio.create_task(move_slot(cluster, slot, to=target, batch=1))
            await eventually(lambda: _gt(refusals(), before))  # the new move was refused
        assert (await again).port == target.port
        assert (await cluster.primary_for_slot(slot)).port == target.port
        assert await src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        async with _node(target) as dst:
            assert [await dst.get(k) for k in keys] == [k.encode() for k in keys]
    finally:
        await src.aclose()


async def _gt(value: Awaitable[int], than: int) -> bool:
    return await value > than


SESSIONS = 6


def _notice(n: int) -> str:
    to = ", ".join(f"r{n}-{i}@example.com" for i in range(5))
    return f"Send the approved notice to {to}, then summarise."


async def test_sessions_complete_while_their_slots_move(
    cluster: RedisClusterServers, nats_server: NatsServer,
) -> None:
    """Five-notice sessions (tool runs, relays, progress deadlines) while the slots of every
    shard move from primary to primary one key at a time, round after round, until all
    sessions settled: each completes, each recipient gets one mail, and no transition was
    half applied (each session's receipts and its state agree)."""
    namespace = f"rs{uuid.uuid4().hex[:6]}"
    async with MailboxServer(delay_ms=20) as mailbox:
        settings = Settings(redis_url=cluster.seed_url, nats_url=nats_server.url,
                            mail_url=mailbox.url, namespace=namespace, shards=4,
                            attempt_ttl_ms=1500, lease_ms=2000, progress_deadline_ms=3000)

        def named(name: str) -> Settings:
            return settings.model_copy(update={"worker_name": name})

        services = [Relay(named("relay-1")), Relay(named("relay-2")),
                    HandsWorker(named("hands-1"), app), HandsWorker(named("hands-2"), app),
                    BrainWorker(named("brain-1"), app), BrainWorker(named("brain-2"), app)]
        slots = shard_slots(namespace, settings.shards)
        moved: list[int] = []
        settled = asyncio.Event()

        async def reshard() -> None:
            while not settled.is_set() or len(moved) < len(slots):
                for slot in slots.values():
                    await move_slot(cluster, slot, batch=1)
                    moved.append(slot)

        async with running(*services):
            client = await Client.connect(settings)

            async def complete() -> list[Submission]:
                subs = [(await client.submit(_notice(n), agent="notices",
                                             request_id=f"req-{n}"))[0]
                        for n in range(SESSIONS)]
                # Under the suite's own timeout, so a wait that runs out says what it waits for.
                done = await asyncio.gather(*(client.wait(s, timeout=90) for s in subs))
                settled.set()
                return done

            try:
                # One group: a move that fails (a slot left half moved) ends the test with its
                # error rather than leaving the sessions to wait for a slot that never moves.
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(reshard())
                    completing = tg.create_task(complete())
                finals = completing.result()
            finally:
                await client.close()
        refused = 0
        for node in cluster.nodes:
            async with _node(node) as r:
                refused += await _refusals(r)
        # Measured, not asserted: how often a call met a slot in migration.
        print(f"{len(moved)} slot moves; {refused} ASK/TRYAGAIN replies on the cluster")
        assert len(moved) >= len(slots)
        assert [f.status for f in finals] == ["completed"] * SESSIONS, finals
        deliveries = Counter(op.to for op in mailbox.operations.values())
        assert len(deliveries) == 5 * SESSIONS
        assert set(deliveries.values()) == {1}, deliveries
        store = await Store.connect(settings)
        try:
            for final in finals:
                await _agree(store, final.session_id)
        finally:
            await store.close()


async def _agree(store: Store, session_id: str) -> None:
    """A session's receipts and its state tell the same story: as many commits as the meta's
    sequence number, one applied result per completed run, no live run or task left."""
    sk = store.keys.session(session_id)
    receipts = await store.receipts(session_id)
    commits = [r for r in receipts if r.kind == "commit"]
    assert int(await store.redis.hget(sk.meta, "seq")) == len(commits), receipts
    completed = {r.detail.run_id for r in receipts if isinstance(r.detail, CompleteDetail)}
    assert len(completed) == 5
    done = {k.decode() if isinstance(k, bytes) else k
            for k in await store.redis.hkeys(sk.runs_done)}
    for run in completed:
        assert {f"{run}.result", f"{run}.applied"} <= done, (run, sorted(done))
    assert not await store.redis.hlen(sk.tasks), "a live task left"
