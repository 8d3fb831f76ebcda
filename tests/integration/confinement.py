"""The role confinement tests' Redis: the users of the ACL file ``baton auth``
writes for deploy/ (rendered as deploy/redis/start.sh does), two seeded sessions, and the
helpers that try an act as a role and check that Redis refuses it and changes nothing (see
test_role_confinement.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from baton.auth import ROLES, redis_acl_file
from baton.brain.held import Holds
from baton.devkit.servers import RedisServer
from baton.errors import BatonError
from baton.settings import Settings
from baton.store.keys import Keys, SessionKeys
from baton.store.scripts import load_functions
from baton.store.store import Store
from tests.helpers import contents

PASSWORDS = {role: f"{role}-pw-{uuid.uuid4().hex[:8]}" for role in (*ROLES, "admin")}
GRANT = "acme-*"
OWN, OTHER = "acme-1", "other-1"  # the client's session and one outside its grant

HOLE_CLIENT = ("submit, start and approve write meta and the outbox of the "
               "client's own sessions")


def gap(reason: str) -> pytest.MarkDecorator:
    """An act Redis does not refuse yet: the test fails only by the act succeeding."""
    return pytest.mark.xfail(strict=True, raises=pytest.fail.Exception, reason=reason)


def render_acl(text: str) -> list[tuple[str, list[str]]]:
    """The users of an ACL file as deploy/redis/start.sh renders it: (name, rules)."""
    users = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        for role, password in PASSWORDS.items():
            line = line.replace(f"${{{role.upper()}_REDIS_PASSWORD}}", password)
        _, name, *rules = line.split()
        users.append((name, rules))
    return users


@dataclass
class Confined:
    server: RedisServer
    namespace: str
    keys: Keys

    def url(self, role: str, password: str | None = None) -> str:
        secret = PASSWORDS[role] if password is None else password
        return self.server.url.replace("redis://", f"redis://{role}:{secret}@")

    def settings(self, role: str) -> Settings:
        return Settings(redis_url=self.url(role), namespace=self.namespace,
                        worker_name=f"{role}-1")

    def connect(self, role: str) -> aioredis.Redis:
        return aioredis.Redis.from_url(self.url(role), decode_responses=True)


@contextlib.asynccontextmanager
async def confined_redis() -> AsyncIterator[Confined]:
    """A private Redis with the users of the deploy ACL file, two sessions seeded."""
    namespace = "acl" + uuid.uuid4().hex[:6]
    async with RedisServer() as server:
        setup = aioredis.Redis.from_url(server.url)
        users = render_acl(redis_acl_file(namespace, client_sessions=GRANT))
        # The default user goes last: this connection is the default user until then.
        for name, rules in sorted(users, key=lambda u: u[0] == "default"):
            await setup.execute_command("ACL", "SETUSER", name, *rules)
        await setup.aclose()
        c = Confined(server, namespace, Keys(namespace, Settings().shards))
        admin = c.connect("admin")
        await load_functions(admin, Settings())  # the roles may not: the admin does
        for sid in (OWN, OTHER):
            await seed(admin, c.keys.session(sid), namespace)
        await admin.aclose()
        yield c


async def seed(admin: aioredis.Redis, sk: SessionKeys, namespace: str) -> None:
    """A session as a Brain leaves it: leased at fence 5, one entry, task, submission, and a
    dispatched run plus an applied one."""
    intent = {"run_id": "r1", "session_id": sk.session_id, "task_id": "t1", "tool": "echo",
              "operation_id": "op1", "wake_subject": f"{namespace}.wake.notices.1"}
    await admin.hset(sk.meta, mapping={
        "agent": "notices", "compat": 1, "wake": f"{namespace}.wake.notices.1", "fence": 5,
        "seq": 3, "holder": "brain-1", "lease_until": 0, "created": 1})
    await admin.rpush(sk.entries, json.dumps({"kind": "user", "text": "hello"}))
    await admin.hset(sk.tasks, "t1", json.dumps({"id": "t1"}))
    await admin.hset(sk.subs, "sub-1", json.dumps({"id": "sub-1", "text": "hello"}))
    await admin.hset(sk.intents, mapping={"r1": json.dumps(intent), "r1.status": "dispatched",
                                          "r1.cancel": 7})
    # a run awaiting an approval bound to its arguments' digest
    gated = {**intent, "run_id": "r2", "tool": "send_email", "approval_digest": "d-real"}
    await admin.hset(sk.intents, mapping={"r2": json.dumps(gated), "r2.digest": "d-real",
                                          "r2.status": "awaiting_approval"})
    await admin.hset(sk.runs_done, mapping={"r0.intent": json.dumps({**intent, "run_id": "r0"}),
                                            "r0.result": '{"outcome":"ok"}'})
    # what the Brain lists and arms in the shard's keys, and a pending row of its outbox
    await admin.zadd(sk.timers, {f"deadline|{sk.session_id}|-|{namespace}.wake.notices.1": 9})
    await admin.zadd(sk.sessions, {sk.session_id: 1})
    await admin.xadd(sk.outbox, {"id": f"{sk.session_id}/3/0", "sid": sk.session_id,
                                 "subj": f"{namespace}.tool.echo", "data": '{"secret": 1}'})


async def snapshot(c: Confined, sid: str) -> list[Any]:
    admin = c.connect("admin")
    sk = c.keys.session(sid)
    try:
        return [await contents(admin, k) for k in (*sk.all(), sk.outbox)]
    finally:
        await admin.aclose()


async def refused(c: Confined, act: Awaitable[Any], *sessions: str) -> None:
    """``act`` is refused by Redis (NOPERM, directly or inside a script) and changes nothing."""
    before = [await snapshot(c, s) for s in sessions or (OWN, OTHER)]
    with pytest.raises((ResponseError, BatonError)) as exc:
        await act
    text = str(exc.value)
    assert any(m in text for m in ("NOPERM", "no permissions", "can't access", "may not")), text
    assert [await snapshot(c, s) for s in sessions or (OWN, OTHER)] == before


async def as_role(c: Confined, role: str, act: Any, *sessions: str) -> None:
    r = c.connect(role)
    try:
        await refused(c, act(r), *sessions)
    finally:
        await r.aclose()


def sk(c: Confined, sid: str = OWN) -> SessionKeys:
    return c.keys.session(sid)


WAKE_ROW = ["id", "forged/1/0", "subj", "{ns}.wake.notices.1", "data", "{{}}", "sid", OWN]
TOOL_ROW = ["id", "forged/2/0", "subj", "{ns}.tool.send_email", "data", "{{}}", "sid", OWN]


def row(c: Confined, template: list[str]) -> dict[str, str]:
    fields = [f.format(ns=c.namespace) for f in template]
    return dict(zip(fields[::2], fields[1::2], strict=True))


def log_key(c: Confined, log: str, role: str, sid: str = OWN) -> str:
    """A role's liveness hash (``workers``) or dead-letter stream (``dead``) on the shard of
    ``sid``."""
    return f"{c.namespace}:{c.keys.tag(c.keys.shard_of(sid))}:{log}:{role}"


async def hold_as_brain(
    confined: Confined,
) -> tuple[Store, Holds, asyncio.Task[None]]:
    """A Brain-role listener on its hold channels, as brain-1 holding OWN's lease."""
    admin = confined.connect("admin")
    await admin.hset(sk(confined).meta, mapping={"listen": "brain-1", "lease_until": 2**42})
    await admin.aclose()
    store = await Store.connect(confined.settings("brain"))
    held = Holds(store.redis, store.keys, "brain-1", store.settings.shards,
                        hold_ms=600_000, limit=4, stopping=asyncio.Event())
    listener = asyncio.create_task(held.run())
    await asyncio.wait_for(held.tried.wait(), 10)
    assert held.listening, "the Brain's credential may subscribe to its hold channels"
    return store, held, listener
