"""Bad Redis Cluster input at start: one clear line naming the setting, non-zero exit.

A seed URL that resolves nowhere, a cluster with slots nobody serves, a replica requirement
the cluster cannot meet. The cluster here is one real ``redis-server`` in cluster mode whose
slots the test assigns itself (no replicas): cheap, and enough to show each refusal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from baton.devkit.redis_cluster import RedisClusterNode
from baton.errors import ConfigError
from baton.settings import Settings
from baton.store.store import Store


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[RedisClusterNode]:
    server = RedisClusterNode(tmp_path / "r1", durable=False, node_timeout_ms=1_000)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _assign(node: RedisClusterNode, first: int, last: int) -> None:
    async with Redis(host=node.host, port=node.port, decode_responses=True) as r:
        await r.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)


def _relay(url: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``baton relay`` against ``url``: it must refuse to start."""
    return subprocess.run(
        [sys.executable, "-m", "baton", "relay"], capture_output=True, text=True, timeout=60,
        env={**os.environ, "BATON_REDIS_URL": url, "BATON_NAMESPACE": "starterr", **env},
        check=False)


def _one_clear_line(proc: subprocess.CompletedProcess[str], setting: str) -> str:
    assert proc.returncode != 0, proc
    # Structured log events (JSON lines, e.g. the worker's stop counters) may come too;
    # the error itself is one plain line.
    lines = [line for line in (proc.stdout + proc.stderr).splitlines()
             if line.strip() and not line.startswith("{")]
    assert len(lines) == 1 and setting in lines[0], (proc.stdout, proc.stderr)
    assert lines[0].startswith("error: ") and "Traceback" not in proc.stderr
    return lines[0]


def test_a_cluster_url_that_resolves_nowhere() -> None:
    line = _one_clear_line(_relay("redis+cluster://no-such-host.invalid:7000"),
                           "BATON_REDIS_URL")
    assert "resolves" in line


async def test_a_cluster_with_unassigned_slots(node: RedisClusterNode) -> None:
    await _assign(node, 0, 8191)
    url = f"redis+cluster://{node.address}"
    with pytest.raises(ConfigError, match="assigns 8192 of 16384 slots"):
        await Store.connect(Settings(redis_url=url, redis_min_replicas=0))
    _one_clear_line(_relay(url, BATON_REDIS_MIN_REPLICAS="0"), "BATON_REDIS_URL")


async def test_a_replica_requirement_the_cluster_cannot_meet(node: RedisClusterNode) -> None:
    await _assign(node, 0, 16383)
    url = f"redis+cluster://{node.address}"
    with pytest.raises(ConfigError, match="BATON_REDIS_MIN_REPLICAS") as caught:
        await Store.connect(Settings(redis_url=url))  # 1 by default on a cluster
    assert f":{node.port} has 0" in str(caught.value)  # a lone node may not know its host
    _one_clear_line(_relay(url, BATON_REDIS_MIN_REPLICAS="2"), "BATON_REDIS_MIN_REPLICAS")
    store = await Store.connect(Settings(redis_url=url, redis_min_replicas=0))
    await store.close()  # without the requirement the same cluster is fine
