"""The Redis client's connections: a connection closed while a command is being written
is a ConnectionError (retryable, "Redis is down"), never a raw AttributeError; script calls
take the pool's short way and behave as through redis-py's generic path.

The race is made deterministic: the connection is disconnected (as another task or a peer
reset would) right after its health check, between redis-py's "is it connected?" check and
its write, which is where the race happens in a live process.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from baton.settings import Settings
from baton.store.redis_client import REDIS_ERRORS, SafeConnection, connect_redis, run_batch


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


async def test_script_calls_share_a_small_pool_and_survive_a_killed_connection(
    settings: Settings,
) -> None:
    """Script calls take pooled connections directly while one is idle and wait for one
    otherwise; a script's error leaves its connection usable, a killed one is dropped, and
    every connection goes back to the pool."""
    client: Any = connect_redis(settings.model_copy(update={"redis_max_connections": 4}))
    try:
        echo = client.register_script("return ARGV[1]")
        failing = client.register_script("return redis.error_reply('refused')")
        replies = await asyncio.gather(*(echo(keys=["k"], args=[str(i)]) for i in range(40)))
        assert replies == [str(i) for i in range(40)]  # 40 calls on at most 4 connections
        pool = client.connection_pool
        assert not pool._in_use_connections and len(pool._available_connections) <= 4
        with pytest.raises(ResponseError, match="refused"):
            await failing(keys=["k"], args=[])
        assert await echo(keys=["k"], args=["after an error"]) == "after an error"
        killer: Any = connect_redis(settings)
        try:
            await killer.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        finally:
            await killer.aclose()
        # A call on a killed connection not yet seen closed fails as a connection error (as
        # it always did) and drops that connection; the pool's other ones are reused.
        answers = []
        for _ in range(5):
            try:
                answers.append(await echo(keys=["k"], args=["after a kill"]))
                break
            except RedisConnectionError:
                continue
        assert answers == ["after a kill"]
        assert await client.ping()
        assert not pool._in_use_connections
    finally:
        await client.aclose()


async def test_a_batch_keeps_each_reply_in_its_place_and_its_connection_in_step(
    settings: Settings,
) -> None:
    """run_batch: one round trip, an error reply kept (read whole) in its place among the
    others, the connection usable after it and back in the pool; a client of one connection
    takes redis-py's pipeline and answers the same."""
    client: Any = connect_redis(settings)
    single: Any = connect_redis(settings).client()
    try:
        await client.delete("batch:h", "batch:s")
        await client.hset("batch:h", mapping={"a": "1", "b": "2"})
        await client.set("batch:s", "x")
        commands = [("HGET", "batch:h", "a"), ("HVALS", "batch:s"), ("HVALS", "batch:h"),
                    ("ZADD", "batch:z", "NX", 5, "m")]
        for answer in (await run_batch(client, commands), await run_batch(single, commands)):
            assert answer[0] == "1" and sorted(answer[2]) == ["1", "2"]
            assert isinstance(answer[1], ResponseError) and "WRONGTYPE" in str(answer[1])
            assert answer[3] in (0, 1)
            await client.delete("batch:z")
        assert await client.get("batch:s") == "x"
        assert not client.connection_pool._in_use_connections
    finally:
        await single.aclose()
        await client.aclose()
