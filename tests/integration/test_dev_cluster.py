"""``DevStack(cluster=True)``: the services start against a Redis Cluster and 3 NATS nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.devkit.devstack import DevStack

pytestmark = pytest.mark.slow


async def test_the_cluster_stack_starts_every_service_on_the_clusters(tmp_path: Path) -> None:
    async with DevStack(tmp_path, cluster=True, hands=1) as stack:
        roles = [p["role"] for p in stack.processes if p["alive"]]
        settings = stack.settings()
    # 3 primaries with 2 replicas each: one lost host leaves every shard a primary and a replica
    assert roles.count("redis-cluster-node") == 9 and roles.count("nats") == 3
    assert {"brain", "hands", "relay", "mailbox"} <= set(roles)
    assert settings.redis_url.startswith("redis+cluster://") and settings.stream_replicas == 3
    assert settings.nats_url.count("nats://") == 3
