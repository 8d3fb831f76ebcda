"""The Redis client's connections: a connection closed while a command is being written
is a ConnectionError (retryable, "Redis is down"), never a raw AttributeError.

The race is made deterministic: the connection is disconnected (as another task or a peer
reset would) right after its health check, between redis-py's "is it connected?" check and
its write, which is where the race happens in a live process.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError

from baton.settings import Settings
from baton.store.redis_client import REDIS_ERRORS, SafeConnection, connect_redis


def _racy(base: type[Connection]) -> type[Connection]:
    class Racy(base):  # type: ignore[valid-type,misc]
        async def check_health(self) -> None:
            await super().check_health()
            await self.disconnect()  # closed under the writer

    return Racy


async def _send_on(conn: Connection) -> None:
    await conn.connect()
    await conn.send_command("PING")


async def test_a_connection_closed_while_writing_is_a_connection_error(
    settings: Settings,
) -> None:
    client: Any = connect_redis(settings)
    try:
        kwargs = client.connection_pool.connection_kwargs
        assert client.connection_pool.connection_class is SafeConnection
        with pytest.raises(RedisConnectionError, match="closed while writing"):
            await _send_on(_racy(SafeConnection)(**kwargs))
        # What redis-py's own class does in the same race: the reason for SafeConnection.
        with pytest.raises(AttributeError):
            await _send_on(_racy(Connection)(**kwargs))
        assert issubclass(RedisConnectionError, REDIS_ERRORS)
        assert await client.ping()  # the client itself is unaffected
    finally:
        await client.aclose()


async def test_cluster_nodes_use_safe_connections(redis_cluster: Any) -> None:
    client: Any = connect_redis(Settings(redis_url=redis_cluster.seed_url))
    try:
        await client.ping()
        nodes = client.get_nodes()
        assert nodes and all(n.connection_class is SafeConnection for n in nodes)
    finally:
        await client.aclose()
