"""``baton dev up --secure --cluster``: the Redis Cluster and the NATS cluster over TLS only,
every service as its role; the servers' own links (cluster bus, replication, routes) too."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from baton.devkit.devstack import DevStack
from baton.devkit.redis_cluster import _client
from tests.helpers import five_notices_once_each

pytestmark = pytest.mark.slow


async def _plaintext_answer(port: int, *, read_greeting: bool = False) -> bytes:
    """What a server answers a plaintext PING (after a NATS client port's INFO greeting,
    which comes before any TLS handshake); b"" when it closes the connection unserved."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        async with asyncio.timeout(10):
            if read_greeting:
                greeting = await reader.readline()
                if not greeting.startswith(b"INFO "):
                    return greeting
                writer.write(b"CONNECT {}\r\n")
            writer.write(b"PING\r\n")
            await writer.drain()
            return await reader.read(1024)
    except (ConnectionResetError, BrokenPipeError):
        return b""
    finally:
        writer.close()


async def test_secure_cluster_runs_five_notices_over_tls_only(tmp_path: Path) -> None:
    async with DevStack(tmp_path, cluster=True, secure=True, hands=1) as stack:
        assert stack.clusters is not None and stack.tls is not None
        settings = stack.settings("client")
        assert settings.redis_url.startswith("rediss+cluster://client:")
        assert settings.nats_url.count("tls://") == 3
        for proc in stack.procs():
            assert proc.env["BATON_REDIS_URL"].startswith(f"rediss+cluster://{proc.role}:")
            assert proc.env["BATON_REDIS_TLS_CA"] == str(stack.tls.ca)

        nodes = stack.clusters.redis.nodes
        for node in nodes:  # TLS port only; the bus and replication links are TLS as well
            assert await _plaintext_answer(node.port) == b""
            async with _client(node) as admin:
                config = await admin.config_get("port", "tls-cluster", "tls-replication")
            assert config == {"port": "0", "tls-cluster": "yes", "tls-replication": "yes"}

        for port in [n.port for n in stack.clusters.nats.nodes] + stack.clusters.nats.route_ports:
            assert await _plaintext_answer(port, read_greeting=True) == b""  # clients, routes

        await five_notices_once_each(settings, stack.mail_url, timeout=90)

        # A restarted replica syncs again from its primary: over TLS, as the admin user
        # (its users and replication login come from the stack's config file), the cluster
        # whole again with every replica link up.
        replica = await stack.clusters.redis.replica_of(
            await stack.clusters.redis.primary_for_slot(0))
        stack.clusters.redis.kill(replica)
        await stack.clusters.redis.restart(replica)
        await stack.clusters.redis.wait_ready()
        async with _client(replica) as admin:
            assert (await admin.info("replication"))["master_link_status"] == "up"
