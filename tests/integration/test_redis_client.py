"""The Redis client (redis-py's public API only): a connection closed while a command is
being written is a ConnectionError (retryable, "Redis is down"), never a raw AttributeError;
script calls share a bounded pool; a batch keeps each reply in its place.

The race is made deterministic: the connection is disconnected (as another task or a peer
reset would) right after its health check, between redis-py's "is it connected?" check and
its write, which is where the race happens in a live process. redis-py 8.1 let an
AttributeError escape there, which is why ``pyproject.toml`` asks for 8.2 or newer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from baton.settings import Settings
from baton.store.redis_client import REDIS_ERRORS, connect_redis, run_batch


def _racy(base: type[Connection]) -> type[Connection]:
    class Racy(base):  # type: ignore[valid-type,misc]
        async def check_health(self) -> None:
            await super().check_health()
            await self.disconnect()  # closed under the writer

    return Racy


async def _send_on(conn: Connection) -> None:
    await conn.connect()
    await conn.send_command("PING")


async def _connections(settings: Settings, name: str) -> int:
    """How many connections the server holds for clients named ``name``."""
    probe: Any = connect_redis(settings)
    try:
        listed = await probe.client_list()
        return sum(1 for c in listed if c.get("name") == name)
    finally:
        await probe.aclose()


async def test_a_connection_closed_while_writing_is_a_connection_error(
    settings: Settings,
) -> None:
    client: Any = connect_redis(settings)
    try:
        kwargs = client.connection_pool.connection_kwargs
        with pytest.raises(RedisConnectionError):
            await _send_on(_racy(client.connection_pool.connection_class)(**kwargs))
        assert issubclass(RedisConnectionError, REDIS_ERRORS)
        assert await client.ping()  # the client itself is unaffected
    finally:
        await client.aclose()


async def test_script_calls_share_a_small_pool_and_survive_a_killed_connection(
    settings: Settings,
) -> None:
    """Script calls share the pool (at most its four connections, a caller waiting for a
    free one); a script's error leaves its connection usable, a killed one is dropped."""
    client: Any = connect_redis(settings.model_copy(update={"redis_max_connections": 4}),
                                client_name="pool-under-test")
    try:
        echo = client.register_script("return ARGV[1]")
        failing = client.register_script("return redis.error_reply('refused')")
        replies = await asyncio.gather(*(echo(keys=["k"], args=[str(i)]) for i in range(40)))
        assert replies == [str(i) for i in range(40)]  # 40 calls on at most 4 connections
        assert await _connections(settings, "pool-under-test") <= 4
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
        assert await _connections(settings, "pool-under-test") <= 4
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
    finally:
        await single.aclose()
        await client.aclose()
