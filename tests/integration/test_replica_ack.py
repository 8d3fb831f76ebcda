"""A transition on a Redis Cluster is acknowledged only once a replica has it (WAIT), and one
whose acknowledgement did not come is in doubt: WriteInDoubtError, retried exactly once.

Real 3+3 cluster; the replica is frozen with SIGSTOP so it cannot acknowledge.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
from redis.asyncio import Redis

from baton.devkit.redis_cluster import RedisClusterNode, RedisClusterServers
from baton.errors import WriteInDoubtError
from baton.models import Entry, Task
from baton.settings import Settings
from baton.store.outbox import Outbox
from baton.store.replication import ReplicatedWrites
from baton.store.store import Store, worker_ref
from baton.store.writes import Writes, timer_member

pytestmark = pytest.mark.slow

BRAIN = worker_ref("brain", "brain-a")
WAKE = "rep.wake.notices.1"


@pytest.fixture(scope="module")
async def cluster() -> AsyncIterator[RedisClusterServers]:
    async with RedisClusterServers(node_timeout_ms=2_000, min_replicas_max_lag_s=30) as servers:
        yield servers


async def _submit(store: Store, session: str, request_id: str = "r1") -> None:
    task = Task(id=f"task-{request_id}", kind="generation", owner=session)
    await store.inbox.submit(
        session, agent="notices", compat=1, wake_subject=WAKE, request_id=request_id,
        text="hi", task=task, worker=worker_ref("client", "c"),
        submission_id=f"sub-{request_id}",
    )


async def _replica_llen(node: RedisClusterNode, key: str) -> int:
    """LLEN read on the replica itself (READONLY on one connection)."""
    async with Redis(host="127.0.0.1", port=node.port, decode_responses=True,
                     single_connection_client=True) as r:
        await r.execute_command("READONLY")
        return int(await r.llen(key))


@asynccontextmanager
async def two_stores(url: str, namespace: str) -> AsyncIterator[tuple[Store, Store]]:
    """A store of the default patience (setting up, retrying: what a loaded machine needs)
    and an impatient one on the same cluster and namespace (:func:`impatient_settings`)."""
    settings = Settings(redis_url=url, namespace=namespace)
    store = await Store.connect(settings)
    impatient = await Store.connect(impatient_settings(settings))
    try:
        yield store, impatient
    finally:
        await impatient.close()
        await store.close()


def impatient_settings(settings: Settings) -> Settings:
    """The same store, giving up on a replica acknowledgement after 300 ms."""
    return settings.model_copy(update={"redis_replica_timeout_ms": 100,
                                       "redis_in_doubt_retry_ms": 300})


@contextmanager
def frozen(node: RedisClusterNode) -> Iterator[None]:
    assert node.pid is not None
    os.kill(node.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(node.pid, signal.SIGCONT)


def test_min_replicas_defaults_to_one_on_a_cluster_and_zero_on_one_server() -> None:
    assert Settings(redis_url="redis+cluster://127.0.0.1:7000").min_replicas() == 1
    assert Settings(redis_url="redis://127.0.0.1:6379/0").min_replicas() == 0
    assert Settings(redis_url="redis+cluster://h:1", redis_min_replicas=0).min_replicas() == 0


async def test_an_acknowledged_commit_is_already_on_the_replica(
    cluster: RedisClusterServers,
) -> None:
    store = await Store.connect(Settings(redis_url=cluster.url, namespace="repack"))
    try:
        await _submit(store, "s1")
        lease, _ = await store.acquire_and_load("s1", BRAIN, 60_000)
        sk = store.keys.session("s1")
        primary = await cluster.primary_for_key(sk.entries)
        replica = await cluster.replica_of(primary)
        for n in range(5):
            _, count = await store.commit(
                "s1", lease.fence, Writes(entries=[Entry(kind="model", text=f"e{n}")]), BRAIN)
            # No polling: the acknowledgement itself means the replica has the entry.
            assert await _replica_llen(replica, sk.entries) == count
    finally:
        await store.close()


async def test_a_commit_no_replica_acknowledges_is_in_doubt_and_its_retry_applies_once(
    cluster: RedisClusterServers,
) -> None:
    # Setting up and retrying use the default patience, which a loaded machine needs; only
    # the write made while the replica is frozen is given up on quickly.
    async with two_stores(cluster.url, "repdoubt") as (store, impatient):
        await _submit(store, "s1")
        lease, state = await store.acquire_and_load("s1", BRAIN, 60_000)
        sk = store.keys.session("s1")
        before = state.entry_count
        replica = await cluster.replica_of(await cluster.primary_for_key(sk.entries))
        writes = Writes(entries=[Entry(kind="model", text="in doubt")])
        args = [lease.fence, BRAIN.model_dump_json(), "s1", *writes.to_script()]
        with frozen(replica):
            with pytest.raises(WriteInDoubtError) as caught:
                await impatient.commit("s1", lease.fence, writes, BRAIN)
            err = caught.value
            assert err.retryable and err.commit_id and err.what == "commit"
            # No failover came: the primary applied it once, across all its retries.
            assert await store.redis.llen(sk.entries) == before + 1
        await cluster.wait_ready()
        # The writer's retry with the same commit id answers the original reply and is
        # acknowledged now; nothing is applied again, however often it is retried.
        first = await store.scripts.run("commit", sk, args, commit_id=err.commit_id)
        again = await store.scripts.run("commit", sk, args, commit_id=err.commit_id)
        assert first == again and int(first[1]) == before + 1
        assert await store.redis.llen(sk.entries) == before + 1
        replica = await cluster.replica_of(await cluster.primary_for_key(sk.entries))
        assert await _replica_llen(replica, sk.entries) == before + 1
        # A new commit id is a new write.
        seq, count = await store.commit("s1", lease.fence, writes, BRAIN)
        assert count == before + 2 and seq > int(first[0])


async def _heard(node: RedisClusterNode, channel: str, publish: Any) -> list[str]:
    """The messages a subscriber of the shard ``channel`` (on ``node``, its primary) hears
    while ``publish()`` runs, up to a sentinel published on the same node after it: sharded
    pub/sub keeps one node's order, so whatever ``publish()`` sent arrives first."""
    async with Redis(host="127.0.0.1", port=node.port, decode_responses=True) as r:
        pubsub = r.pubsub()
        try:
            await pubsub.ssubscribe(channel)
            await pubsub.get_message(timeout=5.0)  # the subscription's confirmation
            await publish()
            await r.spublish(channel, "sentinel")
            heard: list[str] = []
            while True:
                msg = await pubsub.get_message(timeout=30.0)
                assert msg is not None, "the sentinel never came"
                if msg["type"] != "smessage":
                    continue
                if msg["data"] == "sentinel":
                    return heard
                heard.append(msg["data"])
        finally:
            await pubsub.aclose()


async def test_a_settled_answer_is_heard_only_once_a_replica_has_it(
    cluster: RedisClusterServers,
) -> None:
    """A commit that settles a submission tells the waiting clients on the session's
    settled channel, and they answer from that word without reading the store. It was
    SPUBLISHed inside commit.lua, before the WAIT: with the replica frozen a client heard
    an answer that a failover could then lose. Now it is published once the replica
    acknowledged the commit: never while the commit is in doubt, then by the retry."""
    async with two_stores(cluster.url, "repnote") as (store, impatient):
        await _submit(store, "s1")
        lease, _ = await store.acquire_and_load("s1", BRAIN, 60_000)
        sk = store.keys.session("s1")
        channel = store.keys.settled_channel("s1")
        primary = await cluster.primary_for_key(sk.meta)
        replica = await cluster.replica_of(primary)
        writes = Writes(entries=[Entry(kind="model", text="the answer")],
                        notify=[(channel, "settled sub-r1")])

        async def in_doubt() -> None:
            with pytest.raises(WriteInDoubtError):
                await impatient.commit("s1", lease.fence, writes, BRAIN)

        with frozen(replica):
            heard = await _heard(primary, channel, in_doubt)
        assert heard == []  # applied on the primary, not replicated: nobody may hear it
        await cluster.wait_ready()

        async def acknowledged() -> None:
            await store.commit("s1", lease.fence, writes, BRAIN)

        assert await _heard(primary, channel, acknowledged) == ["settled sub-r1"]


async def test_a_submit_in_doubt_retries_to_its_original_reply(
    cluster: RedisClusterServers,
) -> None:
    async with two_stores(cluster.url, "repsub") as (store, impatient):
        await _submit(store, "s1")  # the session exists and its epoch key is written
        sk = store.keys.session("s1")
        replica = await cluster.replica_of(await cluster.primary_for_key(sk.meta))
        task = Task(id="task-r2", kind="generation", owner="s1")
        with frozen(replica):
            with pytest.raises(WriteInDoubtError) as caught:
                await impatient.inbox.submit(
                    "s1", agent="notices", compat=1, wake_subject=WAKE, request_id="r2",
                    text="again", task=task, worker=worker_ref("client", "c"),
                    submission_id="sub-r2")
        await cluster.wait_ready()
        assert caught.value.what == "submit"
        receipts = await store.redis.xlen(sk.receipts)
        # The recorded reply answers the commit id before the script body runs (so the
        # arguments do not matter here): "created", and still exactly one new request.
        reply = await store.scripts.run("submit", sk, ["s1"], commit_id=caught.value.commit_id)
        assert int(reply[0]) == 1
        assert sorted(await store.redis.hkeys(sk.inbox)) == ["submit:r1", "submit:r2"]
        assert await store.redis.xlen(sk.receipts) == receipts


async def test_relay_acks_and_timer_firings_wait_for_a_replica_too(
    cluster: RedisClusterServers,
) -> None:
    """The relay's writes that settle work: an ack (row deleted) and a firing (wake row
    added) are on the replica when acknowledged; with the replica frozen they are in doubt."""
    settings = Settings(redis_url=cluster.url, namespace="reprelay")
    store = await Store.connect(settings)
    try:
        def outbox(s: Settings) -> Outbox:
            return Outbox(store.redis, store.keys, writes=ReplicatedWrites(
                store.redis, min_replicas=s.min_replicas(),
                timeout_ms=s.redis_replica_timeout_ms, retry_ms=s.redis_in_doubt_retry_ms))

        box, impatient = outbox(settings), outbox(impatient_settings(settings))
        await _submit(store, "s1")
        shard = store.keys.shard_of("s1")
        key = store.keys.outbox(shard)
        replica = await cluster.replica_of(await cluster.primary_for_key(key))
        relay = await box.lease("acquire", shard, "relay-1", 60_000)
        await box.ensure_groups([shard])
        rows = await box.read([shard], "relay-1", 100, None)
        assert rows
        assert await box.ack(rows, "relay-1", {shard: relay.fence}) == {}
        assert await _replica_xlen(replica, key) == 0  # no polling: acknowledged = replicated

        lease = await store.acquire("s1", BRAIN, 60_000)
        member = timer_member("task", "s1", "task-r1", WAKE)
        await store.commit("s1", lease.fence, Writes(timers_add={member: 1}), BRAIN)
        with frozen(replica):
            with pytest.raises(WriteInDoubtError) as caught:
                await impatient.fire_timers(shard, 100, 1000, "relay-1", relay.fence)
            assert caught.value.what == "fire_timers"
        await cluster.wait_ready()
        await store.commit("s1", lease.fence, Writes(timers_add={member: 1}), BRAIN)
        assert await box.fire_timers(shard, 100, 1000, "relay-1", relay.fence) == 1
        assert await _replica_xlen(replica, key) == 2  # both firings' wake rows
    finally:
        await store.close()


async def _replica_xlen(node: RedisClusterNode, key: str) -> int:
    async with Redis(host="127.0.0.1", port=node.port, decode_responses=True,
                     single_connection_client=True) as r:
        await r.execute_command("READONLY")
        return int(await r.xlen(key))


async def test_a_write_a_primary_refuses_for_want_of_replicas_names_its_shard(
    tmp_path: Any,
) -> None:
    """A primary whose replica stopped acknowledging (here frozen past the 1 s lag the
    split-brain guard allows) refuses writes with NOREPLICAS. The write is retried for the
    in-doubt budget, never in doubt (nothing ran), then fails with one sentence naming the
    session, the slot and the node that refused, how long it was retried, and why."""
    from baton.errors import RedisUnavailable

    async with RedisClusterServers(node_timeout_ms=60_000, min_replicas_max_lag_s=1) as lagged:
        async with two_stores(lagged.url, "repnorep") as (store, impatient):
            await _submit(store, "s1")
            sk = store.keys.session("s1")
            primary = await lagged.primary_for_key(sk.meta)
            replica = await lagged.replica_of(primary)
            with frozen(replica):
                async def refused() -> str | None:
                    try:
                        await impatient.inbox.submit(
                            "s1", agent="notices", compat=1, wake_subject=WAKE,
                            request_id="r2", text="again", task=Task(
                                id="task-r2", kind="generation", owner="s1"),
                            worker=worker_ref("client", "c"), submission_id="sub-r2")
                    except WriteInDoubtError:  # (a RedisUnavailable too: caught first)
                        return None  # the guard has not seen the lag yet: the WAIT timed out
                    except RedisUnavailable as exc:
                        return str(exc)
                    raise AssertionError("the frozen replica's primary took the write")

                from tests.helpers import eventually

                message = await eventually(refused, timeout=30,
                                           message="the primary refuses for want of replicas")
    assert message.startswith("redis refused submit for session s1 (slot "), message
    assert f" on 127.0.0.1:{primary.port}) for 0.3 s: not applied: NOREPLICAS" in message


async def test_a_client_write_waits_out_a_refusal_then_names_the_shard(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Client.submit on a primary whose split-brain guard refuses writes (its replica frozen
    past the lag it allows): a client whose patience (client_connect_wait_s) runs out first
    fails with one sentence naming the session, its slot, the node and NOREPLICAS; a client
    still waiting when the replica is back has its submission taken. Nothing is written by
    a refused attempt, and the request id makes the attempts one submission."""
    import asyncio
    import logging

    from redis.crc import key_slot

    from baton.client import Client
    from baton.errors import RedisUnavailable
    from tests.helpers import eventually

    caplog.set_level(logging.INFO, logger="baton.client")

    async with RedisClusterServers(node_timeout_ms=60_000, min_replicas_max_lag_s=1) as lagged:
        settings = Settings(redis_url=lagged.url, namespace="clientwait")
        store = await Store.connect(impatient_settings(settings))
        hasty = await Client.connect(impatient_settings(settings).model_copy(
            update={"client_connect_wait_s": 1.0}))
        patient = await Client.connect(settings.model_copy(
            update={"client_connect_wait_s": 60.0}))
        hasty.warn_unserved = patient.warn_unserved = False
        try:
            await _submit(store, "s1")
            primary = await lagged.primary_for_key(store.keys.session("s1").meta)
            replica = await lagged.replica_of(primary)
            with frozen(replica):
                async def refusing() -> bool:
                    try:
                        await _submit(store, "s1", request_id="probe")
                    except WriteInDoubtError:
                        return False  # the guard has not seen the lag yet
                    except RedisUnavailable as exc:
                        return "NOREPLICAS" in str(exc)
                    raise AssertionError("the frozen replica's primary took the write")

                await eventually(refusing, timeout=30, message="the primary refuses writes")
                with pytest.raises(RedisUnavailable) as refused:
                    await hasty.submit("again", agent="notices", session_id="s1",
                                       request_id="r2")
                caplog.clear()
                waiting = asyncio.create_task(patient.submit(
                    "again", agent="notices", session_id="s1", request_id="r3"))

                def refused_once() -> bool:
                    return any(r.getMessage().startswith("client_write_waiting")
                               for r in caplog.records)

                await eventually(refused_once, timeout=30, message="the patient client refused")
                assert not waiting.done()
            sub, created = await asyncio.wait_for(waiting, 60)
        finally:
            await patient.close()
            await hasty.close()
            await store.close()
    message = str(refused.value)
    slot = key_slot(store.keys.session("s1").meta.encode())
    assert message.startswith(
        f"redis refused submit for session s1 (slot {slot} on 127.0.0.1:{primary.port}) for "
    ), message
    assert ": not applied: NOREPLICAS" in message and message.count(". ") <= 1, message
    assert created and sub.request_id == "r3"
