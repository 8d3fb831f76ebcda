"""A real Redis Cluster (3 primaries, 1 replica each) on loopback: start, connect, fail over.

Each cluster takes a few seconds to form (``redis-cli --cluster create`` and replica sync),
so these tests are ``slow``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import ResponseError

from baton.client import Client
from baton.devkit.redis_cluster import SLOTS, RedisClusterServers
from baton.errors import ConfigError, StoreEpochError
from baton.settings import Settings
from baton.store.keys import Keys
from baton.store.redis_client import connect_redis, is_cluster, parse_cluster_url
from baton.store.store import Store
from tests.helpers import eventually

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
async def cluster() -> AsyncIterator[RedisClusterServers]:
    async with RedisClusterServers(node_timeout_ms=2_000) as servers:
        yield servers


async def test_the_cluster_has_three_primaries_each_with_a_replica_and_every_slot(
    cluster: RedisClusterServers,
) -> None:
    topo = await cluster.topology()
    primaries = [n for n in topo if n.role == "primary"]
    replicas = [n for n in topo if n.role == "replica"]
    assert len(primaries) == 3 and len(replicas) == 3
    assert {r.primary_id for r in replicas} == {p.node_id for p in primaries}
    covered = sum(hi - lo + 1 for p in primaries for lo, hi in p.slots)
    assert covered == SLOTS


async def test_a_client_connects_by_seed_url_and_runs_a_script_on_one_hash_tag(
    cluster: RedisClusterServers,
) -> None:
    settings = Settings(redis_url=cluster.seed_url, namespace="seed")
    store = await Store.connect(settings)
    try:
        assert is_cluster(store.redis)
        keys = Keys("seed", 16)
        tag = keys.tag(5)
        script = store.redis.register_script(
            "redis.call('HSET', KEYS[1], 'f', ARGV[1]) "
            "return redis.call('XADD', KEYS[2], '*', 'v', ARGV[1])")
        row = await script(keys=[f"seed:{tag}:h", f"seed:{tag}:outbox"], args=["x"])
        assert await store.redis.hget(f"seed:{tag}:h", "f") == "x"
        primary = await cluster.primary_for_key(f"seed:{tag}:h")
        assert primary.port in {n.port for n in cluster.nodes} and row
    finally:
        await store.close()


async def test_a_primary_restarted_empty_stops_a_client_with_store_epoch_error(
    cluster: RedisClusterServers,
) -> None:
    settings = Settings(redis_url=cluster.seed_url, namespace="lost")
    client = await Client.connect(settings)
    try:
        keys = Keys("lost", settings.shards)
        victim = await cluster.primary_for_key(keys.epoch(0))
        lost_shards = {s for s in range(settings.shards)
                       if (await cluster.primary_for_key(keys.epoch(s))).port == victim.port}
        # Back before node_timeout: no failover, the node keeps its slots with no data and
        # its replica resyncs to the empty copy.
        cluster.kill(victim)
        await cluster.restart(victim, empty=True)
        assert client.epoch is not None

        async def lost() -> StoreEpochError | None:
            try:
                await client.epoch.verify()  # type: ignore[union-attr]
            except StoreEpochError as exc:
                return exc
            except Exception:  # connections to the restarted node are re-made
                return None
            return None

        error = await eventually(lost, timeout=15, message="the lost epoch is seen")
    finally:
        await client.close()
        await cluster.wait_ready()
    assert error.reason == "missing"
    assert {int(s) for s in error.shards.split(",")} == lost_shards


async def test_killing_a_primary_promotes_its_replica() -> None:
    async with RedisClusterServers(node_timeout_ms=1_000) as cluster:
        key = "{fo-1}:k"
        old = await cluster.primary_for_key(key)
        replica = await cluster.replica_of(old)
        redis: Any = connect_redis(Settings(redis_url=cluster.seed_url))
        try:
            async def written() -> bool:
                # The split-brain guard (min-replicas-to-write 1) refuses a write while the
                # replica's last acknowledgement is older than the allowed lag: on a loaded
                # machine the first write may meet NOREPLICAS.
                try:
                    await redis.set(key, "before")
                except ResponseError as exc:
                    assert "NOREPLICAS" in str(exc), exc
                    return False
                return int(await redis.wait(1, 2_000)) >= 1  # the replica has it

            await eventually(written, timeout=15, message="the write reaches the replica")
            cluster.kill(old)
            promoted = await cluster.wait_promoted(old)

            async def read() -> Any:
                try:
                    return await redis.get(key)
                except Exception:  # the first call after the kill meets the dead node
                    return None

            value = await eventually(read, timeout=15, message="the key reads again")
        finally:
            await redis.aclose()
    assert promoted.port == replica.port and value == "before"


async def test_a_durable_cluster_started_again_on_new_ports_forms_with_its_data(
        tmp_path: Path) -> None:
    """Each start picks free ports while every ``nodes.conf`` names the old ones: the nodes
    are told each other's new addresses, and the cluster serves the data it had."""
    async def write_and_wait(redis: Any) -> bool:
        try:
            await redis.set("{dur-1}:k", "kept")
        except ResponseError as exc:
            assert "NOREPLICAS" in str(exc), exc
            return False
        return int(await redis.wait(1, 2_000)) >= 1

    async with RedisClusterServers(tmp_path, durable=True) as first:
        old_ports = {n.port for n in first.nodes}
        redis: Any = connect_redis(Settings(redis_url=first.seed_url))
        try:
            await eventually(lambda: write_and_wait(redis), timeout=15, message="the write")
        finally:
            await redis.aclose()
    async with RedisClusterServers(tmp_path, durable=True) as again:
        assert {n.port for n in again.nodes} != old_ports  # new ports: the case that failed
        redis = connect_redis(Settings(redis_url=again.seed_url))
        try:
            assert await redis.get("{dur-1}:k") == "kept"
        finally:
            await redis.aclose()


@pytest.mark.parametrize("url", [
    "redis+cluster://no-such-host.invalid:7000,also-not.invalid:7001",
    "redis+cluster://127.0.0.1",
    "redis+cluster://127.0.0.1:7000/3",
])
async def test_a_bad_cluster_url_is_a_config_error_naming_the_setting(url: str) -> None:
    with pytest.raises(ConfigError, match="BATON_REDIS_URL"):
        await Store.connect(Settings(redis_url=url))


def test_cluster_urls_parse_seeds_and_credentials() -> None:
    parsed = parse_cluster_url("rediss+cluster://brain:s%40cret@r1:7000,r2:7001")
    assert parsed.seeds == (("r1", 7000), ("r2", 7001))
    assert (parsed.username, parsed.password, parsed.tls) == ("brain", "s@cret", True)
