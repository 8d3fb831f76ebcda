"""Lost state is loud: a store that restarted empty stops its users with StoreEpochError.

Each test runs its own non-durable ``redis-server``, since it restarts it empty.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from baton.client import Client
from baton.devkit.servers import NatsServer, RedisServer
from baton.errors import RedisUnavailable, StoreEpochError, StoreLayoutError
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.epoch import STORE_LAYOUT, StoreEpoch
from baton.store.keys import Keys
from baton.store.redis_client import connect_redis
from tests.helpers import eventually


@pytest.fixture
async def own_redis() -> AsyncIterator[RedisServer]:
    async with RedisServer(durable=False) as server:
        yield server


async def _restart_empty(server: RedisServer) -> None:
    server.kill()
    await server.restart()


async def test_a_waiting_client_gets_store_epoch_error_not_not_found(
    own_redis: RedisServer,
) -> None:
    settings = Settings(redis_url=own_redis.url, namespace="epoch")
    client = await Client.connect(settings)
    try:
        sub, _ = await client.submit("hello", agent="notices")
        await _restart_empty(own_redis)

        async def outcome() -> BaseException | None:
            try:
                await client.wait(sub, timeout=2)
            except RedisUnavailable:  # the pooled connection died with the server
                return None
            except Exception as exc:
                return exc
            return None

        error = await eventually(outcome, timeout=10, message="the wait fails")
    finally:
        await client.close()
    assert isinstance(error, StoreEpochError), error
    assert error.reason == "missing" and error.namespace == "epoch"


async def test_a_running_relay_stops_with_store_epoch_error(
    own_redis: RedisServer, nats_server: NatsServer
) -> None:
    settings = Settings(redis_url=own_redis.url, nats_url=nats_server.url,
                        namespace="epochrelay", lease_ms=300, worker_name="relay-1")
    relay = Relay(settings)
    serving = asyncio.create_task(relay.serve())
    try:
        await asyncio.wait_for(relay.ready.wait(), 10)
        await _restart_empty(own_redis)
        async with asyncio.timeout(10):
            with pytest.raises(BaseExceptionGroup) as caught:
                await serving
    finally:
        relay.shutdown()
        await asyncio.gather(serving, return_exceptions=True)
    lost = caught.value.subgroup(lambda e: isinstance(e, StoreEpochError))
    assert lost is not None, caught.value


async def test_a_new_process_refuses_a_store_missing_shards_after_initialisation(
    own_redis: RedisServer,
) -> None:
    settings = Settings(redis_url=own_redis.url, namespace="epochinit", shards=4)
    redis: Any = connect_redis(settings)
    keys = Keys(settings.namespace, settings.shards)
    try:
        first = await StoreEpoch.establish(redis, keys)
        again = await StoreEpoch.establish(redis, keys)
        assert again.id == first.id  # a second process adopts the store's epoch
        old = json.dumps({"v": 1, "id": first.id, "created_ms": 1})  # long initialised
        await redis.set(keys.epoch(0), old)
        await redis.delete(keys.epoch(2))
        with pytest.raises(StoreEpochError) as running:
            await first.verify()
        with pytest.raises(StoreEpochError) as starting:
            await StoreEpoch.establish(redis, keys)
        await redis.set(keys.epoch(2), json.dumps({"v": 1, "id": "other", "created_ms": 1}))
        with pytest.raises(StoreEpochError) as changed:
            await first.verify()
    finally:
        await redis.aclose()
    assert running.value.reason == "missing" and running.value.shards == "2"
    assert starting.value.reason == "missing"
    assert changed.value.reason == "changed" and changed.value.found == "other"


async def test_inspect_shows_the_epoch_and_a_red_line_once_a_shard_lost_it(
    own_redis: RedisServer,
) -> None:
    from io import StringIO

    from rich.console import Console

    from baton.cli.inspect import cluster_view, render_cluster, render_session, session_view

    settings = Settings(redis_url=own_redis.url, namespace="epinspect", shards=4)
    client = await Client.connect(settings)
    try:
        await client.submit("hello", agent="notices", session_id="s-epoch")
        store = client.store
        view = await cluster_view(store)
        epoch = view["epoch"]
        assert client.epoch is not None
        assert epoch["state"] == "ok" and epoch["id"] == client.epoch.id
        assert epoch["created_ms"] and not epoch["missing_shards"]
        shard = store.keys.shard_of("s-epoch")
        await store.redis.delete(store.keys.epoch(shard))
        view = await cluster_view(store)
        assert view["epoch"]["state"] == "missing"
        assert view["epoch"]["missing_shards"] == [shard]
        session = await session_view(store, "s-epoch")
        assert session["epoch"]["session_shard"]["state"] == "missing"
        out = StringIO()
        render_cluster(view, Console(file=out, width=200))
        render_session(session, Console(file=out, width=200))
        text = out.getvalue()
        assert f"store epoch: {epoch['id']}" in text
        assert f"STORE EPOCH MISSING on shard(s) {shard}" in text
    finally:
        await client.close()


async def test_a_store_written_by_another_key_layout_is_refused_at_start(
    own_redis: RedisServer,
) -> None:
    """A store stamped with an older layout (or none: layout 1) is refused with one clear
    error before anything is read from its sessions."""
    settings = Settings(redis_url=own_redis.url, namespace="layout", shards=2)
    redis: Any = connect_redis(settings)
    keys = Keys(settings.namespace, settings.shards)
    try:
        old = json.dumps({"v": 1, "id": "e1", "created_ms": 1})  # written before the stamp
        for shard in range(settings.shards):
            await redis.set(keys.epoch(shard), old)
        with pytest.raises(StoreLayoutError) as refused:
            await StoreEpoch.establish(redis, keys)
        with pytest.raises(StoreLayoutError):
            await Client.connect(settings)
    finally:
        await redis.aclose()
    assert refused.value.found == 1 and refused.value.expected == STORE_LAYOUT
    assert "key layout 1" in str(refused.value)


async def test_an_idle_process_checks_the_epoch_at_once_when_work_arrives(
    own_redis: RedisServer,
) -> None:
    """Idle, the check waits a long idle interval; work arriving (``woken``) checks now."""
    settings = Settings(redis_url=own_redis.url, namespace="epochidle")
    redis: Any = connect_redis(settings)
    keys = Keys(settings.namespace, settings.shards)
    stopping, woken = asyncio.Event(), asyncio.Event()
    try:
        epoch = await StoreEpoch.establish(redis, keys)
        before = await _epoch_reads(redis)
        watching = asyncio.create_task(epoch.watch(
            stopping, 0.05, idle_s=3600.0, busy=lambda: False, woken=woken))

        async def checked_once() -> bool:
            return await _epoch_reads(redis) > before

        await eventually(checked_once, timeout=10, message="the first check")
        await redis.delete(keys.epoch(1))  # lost while idle: nothing looks yet
        await asyncio.sleep(0)
        assert not watching.done()
        woken.set()  # a message arrives
        with pytest.raises(StoreEpochError) as lost:
            async with asyncio.timeout(10):
                await watching
    finally:
        stopping.set()
        await redis.aclose()
    assert lost.value.reason == "missing"


async def _epoch_reads(redis: Any) -> int:
    """GET and MGET calls the server has answered (the epoch checks are the only reads of
    that kind here: one MGET per check on a single server)."""
    stats = await redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("get", "mget"))


async def test_accept_loss_restores_the_epoch_of_the_lost_shards_so_workers_start(
    own_redis: RedisServer,
) -> None:
    """The way back an operator has after shards lost their state (a FLUSHALL of one
    cluster primary): every worker refuses the store until `baton accept-loss` writes the
    surviving epoch to the shards that lost it. Nothing that exists is changed, and shards
    that disagree are refused."""
    import os
    import subprocess
    import sys

    settings = Settings(redis_url=own_redis.url, namespace="epochloss", shards=4)
    env = {**os.environ, **settings.to_env(), "BATON_DEBUG": ""}
    redis: Any = connect_redis(settings)
    keys = Keys(settings.namespace, settings.shards)

    def accept_loss(*args: str, answer: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "baton", "accept-loss", *args],
                              capture_output=True, text=True, timeout=60, env=env, check=False,
                              input=answer)

    try:
        first = await StoreEpoch.establish(redis, keys)
        old = json.dumps({"v": 1, "id": first.id, "created_ms": 1, "layout": STORE_LAYOUT})
        for shard in range(settings.shards):  # long initialised
            await redis.set(keys.epoch(shard), old)
        whole = accept_loss("--json")
        assert whole.returncode == 0 and json.loads(whole.stdout)["state"] == "ok"
        await redis.delete(keys.epoch(1), keys.epoch(3))
        with pytest.raises(StoreEpochError):
            await StoreEpoch.establish(redis, keys)
        for answer in ("n\n", ""):  # no --yes and a no, or no answer: nothing is written
            asked = accept_loss(answer=answer)
            assert asked.returncode == 1 and "shard(s) 1, 3" in asked.stderr
            assert asked.stderr.splitlines()[-1] == (
                "error: the loss was not accepted; nothing restored"), asked.stderr
        scripted = accept_loss("--json")  # JSON asks nobody: it needs --yes
        assert scripted.returncode == 1 and "needs --yes" in scripted.stderr
        assert await redis.exists(keys.epoch(1)) == 0
        done = accept_loss("--yes", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["restored"] == [1, 3]
        assert (await StoreEpoch.establish(redis, keys)).id == first.id  # workers start
        assert await redis.get(keys.epoch(0)) == old  # untouched
        await redis.delete(keys.epoch(1))
        await redis.set(keys.epoch(2), json.dumps({"v": 1, "id": "other", "created_ms": 1}))
        mixed = accept_loss("--yes")
        assert mixed.returncode == 1 and "disagree" in mixed.stderr
        assert await redis.exists(keys.epoch(1)) == 0
    finally:
        await redis.aclose()


async def test_a_read_that_saw_the_anchor_before_a_racing_initialisation_adopts_the_epoch(
    own_redis: RedisServer,
) -> None:
    """On a cluster the epoch read spans nodes in no set order: the anchor's node may be
    read before another process initialises the store and the other shards after. That is
    a store being created, not a lost anchor (a rolling start refused a Brain for it)."""
    settings = Settings(redis_url=own_redis.url, namespace="epochrace", shards=4)
    redis: Any = connect_redis(settings)
    keys = Keys(settings.namespace, settings.shards)

    class ReadAcrossARace(StoreEpoch):
        racing = True

        async def _read(self) -> list[dict[str, Any] | None]:
            if not self.racing:
                return await super()._read()
            self.racing = False
            assert await self.redis.get(keys.epoch(0)) is None  # the anchor's node first
            other = await StoreEpoch.establish(redis, keys)  # another process, meanwhile
            self.winner = other.id
            rest = await super()._read()
            return [None, *rest[1:]]

    try:
        late = ReadAcrossARace(redis, keys)
        adopted = await late._establish()
        assert adopted.id == late.winner
        assert (await StoreEpoch.survey(redis, keys)).state == "ok"
    finally:
        await redis.aclose()

