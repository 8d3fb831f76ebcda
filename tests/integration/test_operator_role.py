"""The read-only ``operator``: reads every key of the namespace and writes none; on NATS only
the streams' and consumers' info. On real servers with auth on, with the users of the single
source the deploy files are generated from (:mod:`baton.auth`): the operator's views show
what a client's credential may not read, and Redis or NATS refuses each of its writes, one
act per test, the session's keys unchanged.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError

from baton.auth import ROLES, nats_users_config, redis_acl_file
from baton.bus.bus import Bus
from baton.devkit.servers import NatsServer, RedisServer
from baton.errors import ForbiddenError
from baton.settings import Settings
from baton.store.keys import Keys, SessionKeys
from baton.store.scripts import library_code, load_functions
from baton.store.store import Store
from tests.helpers import contents
from tests.integration.confinement import PASSWORDS, render_acl, seed

SESSION = "acme-1"


@dataclass
class Operated:
    redis: RedisServer
    nats: NatsServer
    namespace: str
    keys: Keys

    def settings(self, role: str) -> Settings:
        url = self.redis.url.replace("redis://", f"redis://{role}:{PASSWORDS[role]}@")
        return Settings(redis_url=url, nats_url=self.nats.url, namespace=self.namespace,
                        nats_user=role, nats_password=PASSWORDS[role], worker_name=f"{role}-1")

    def connect(self, role: str) -> aioredis.Redis:
        return aioredis.Redis.from_url(self.settings(role).redis_url, decode_responses=True)

    @property
    def sk(self) -> SessionKeys:
        return self.keys.session(SESSION)


@pytest.fixture(scope="module")
async def operated() -> AsyncIterator[Operated]:
    namespace = "op" + uuid.uuid4().hex[:6]
    nats_users = nats_users_config(namespace, {r: PASSWORDS[r] for r in ROLES},
                                   admin_password=PASSWORDS["admin"])
    async with RedisServer() as redis_server, NatsServer(extra_config=nats_users) as nats_server:
        setup = aioredis.Redis.from_url(redis_server.url)
        for name, rules in sorted(render_acl(redis_acl_file(namespace)),
                                  key=lambda u: u[0] == "default"):
            await setup.execute_command("ACL", "SETUSER", name, *rules)
        await setup.aclose()
        o = Operated(redis_server, nats_server, namespace, Keys(namespace, Settings().shards))
        admin = o.connect("admin")
        await load_functions(admin, Settings())  # the roles may not: the admin does
        await seed(admin, o.sk, namespace)
        await admin.xadd(o.keys.dead(SESSION, "hands"),
                         {"reason": "unknown_tool", "session_id": SESSION})
        await admin.aclose()
        relay = await Bus.connect(o.settings("relay"), "relay-test", "relay")
        try:  # a wake waiting in JetStream, which no consumer takes
            await relay.ensure_streams()
            await relay.publish(relay.wake_subject("notices", 1), b"{}", msg_id="w1")
        finally:
            await relay.close()
        yield o


async def _digest(o: Operated) -> dict[str, Any]:
    admin = o.connect("admin")
    try:
        keys = [*o.sk.all(), o.sk.outbox, o.sk.timers, o.sk.sessions]
        return {k: await contents(admin, k) for k in keys}
    finally:
        await admin.aclose()


async def test_the_operator_sees_what_a_client_may_not(operated: Operated) -> None:
    """``baton inspect``'s cluster view as the operator: the session index, the outbox
    backlog, dead letters and the JetStream subjects; the session view with its timers."""
    from baton.cli.inspect import cluster_view, session_view

    settings = operated.settings("operator")
    store = await Store.connect(settings)
    bus = await Bus.connect(settings, "inspect", "operator")
    try:
        cluster = await cluster_view(store, bus)
        session = await session_view(store, SESSION)
    finally:
        await bus.close()
        await store.close()
    # (the seeded records are sketches: a finding says one does not parse, none is refused)
    assert not [f for f in cluster["findings"] + session["findings"] if "not readable" in f]
    assert cluster["sessions_total"] == 1
    assert sum(b["rows"] for b in cluster["backlog"]) == 1
    assert cluster["dead_letters"]["count"] == 1
    assert cluster["subjects"]["error"] is None
    assert [r["subject"] for r in cluster["subjects"]["rows"]] == [
        f"{operated.namespace}.wake.notices.1"]
    assert session["timers"], session


async def test_the_operator_reads_a_trace(operated: Operated) -> None:
    from baton.cli.observe import _live_receipts

    receipts, quarantine, _ = await _live_receipts(operated.settings("operator"), SESSION,
                                                None)
    assert quarantine is None and isinstance(receipts, list)


def _writes(o: Operated) -> dict[str, Callable[[aioredis.Redis], Awaitable[Any]]]:
    sk = o.sk
    return {
        "hset": lambda r: r.hset(sk.meta, "fence", 1),
        "xadd": lambda r: r.xadd(sk.outbox, {"sid": SESSION, "subj": f"{o.namespace}.tool.x"}),
        "del": lambda r: r.delete(sk.entries),
        "set the epoch": lambda r: r.set(o.keys.epoch(sk.shard), "forged"),
        "script load": lambda r: r.script_load("return 1"),
        "eval": lambda r: r.eval("return redis.call('DEL', KEYS[1])", 1, sk.entries),
        "fcall": lambda r: r.execute_command(
            "FCALL", f"{library_code(True)[0]}_ping", 0),
        "function load": lambda r: r.function_load(
            "#!lua name=forged\nredis.register_function('forged', function() return 1 end)"),
        "flushall": lambda r: r.flushall(),
        "config set": lambda r: r.config_set("appendonly", "no"),
        "keys": lambda r: r.keys("*"),
        "spublish": lambda r: r.execute_command("SPUBLISH", o.keys.settled_channel(SESSION),
                                                "forged"),
        "read another namespace": lambda r: r.hgetall(f"x{o.namespace}:{{x-0}}:s:a:meta"),
    }


@pytest.mark.parametrize("act", ["hset", "xadd", "del", "set the epoch", "script load", "eval",
                                 "flushall", "config set", "keys", "spublish",
                                 "read another namespace"])
async def test_redis_refuses_the_operator(operated: Operated, act: str) -> None:
    before = await _digest(operated)
    r = operated.connect("operator")
    try:
        with pytest.raises(NoPermissionError):
            await _writes(operated)[act](r)
    finally:
        await r.aclose()
    assert await _digest(operated) == before


async def test_redis_refuses_the_operator_a_loaded_script(operated: Operated) -> None:
    """A script some other role loaded (every role's scripts are in the one script cache)."""
    admin = operated.connect("admin")
    sha = await admin.script_load("return redis.call('HSET', KEYS[1], 'fence', 1)")
    await admin.aclose()
    before = await _digest(operated)
    r = operated.connect("operator")
    try:
        for call in ("evalsha", "evalsha_ro"):
            with pytest.raises(NoPermissionError):
                await r.execute_command(call.upper(), sha, 1, operated.sk.meta)
    finally:
        await r.aclose()
    assert await _digest(operated) == before


@pytest.mark.parametrize("kind", ["wake", "tool"])
async def test_nats_refuses_the_operators_publish(operated: Operated, kind: str) -> None:
    async with await Bus.connect(operated.settings("operator"), "op", "operator") as bus:
        subject = (bus.wake_subject("notices", 1) if kind == "wake"
                   else bus.tool_subject("send_email"))
        with pytest.raises(ForbiddenError, match="operator may not publish to"):
            await bus.publish(subject, b"{}", msg_id=f"forged-{kind}")


@pytest.mark.parametrize("kind", ["wake", "tool"])
async def test_nats_refuses_the_operators_subscription(operated: Operated, kind: str) -> None:
    async with await Bus.connect(operated.settings("operator"), "op", "operator") as bus:
        subject = (bus.wake_subject("notices", 1) if kind == "wake"
                   else bus.tool_subject("send_email"))

        async def listen() -> None:
            sub = await bus.nc.subscribe(subject)
            await sub.next_msg(timeout=60)

        with pytest.raises(ForbiddenError, match="operator may not subscribe to"):
            await bus.guarded("subscribe to", subject, listen())


@pytest.mark.parametrize("kind", ["wake", "tool"])
async def test_nats_refuses_the_operator_a_consumer(operated: Operated, kind: str) -> None:
    """It may neither make a consumer of a stream nor pull from one that exists."""
    async with await Bus.connect(operated.settings("operator"), "op", "operator") as bus:
        names = bus.names
        stream, durable, subject = (
            (names.wake_stream, names.wake_durable("notices", 1), names.wake_subject("notices", 1))
            if kind == "wake" else
            (names.tool_stream, names.tool_durable("echo"), names.tool_subject("echo")))
        with pytest.raises(ForbiddenError, match="operator may not manage the consumer"):
            await bus.ensure_consumer(stream, durable, subject)
        admin_settings = operated.settings("relay").model_copy(
            update={"nats_user": "admin", "nats_password": PASSWORDS["admin"]})
        async with await Bus.connect(admin_settings, "admin") as admin:
            await admin.ensure_consumer(stream, durable, subject)
        puller = await bus.pull(stream, durable)
        try:
            with pytest.raises(ForbiddenError, match="operator may not pull from"):
                await puller.fetch(1, timeout=5.0)
        finally:
            await puller.close()
