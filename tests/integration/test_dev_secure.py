"""``baton dev up --secure``: the local stack with per-stack credentials and TLS, every service
as its role."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, ResponseError

from baton.client import Client
from baton.devkit.dev import _pid_alive
from baton.devkit.devstack import DevStack
from baton.devkit.secure import (
    CREDENTIALS,
    REDIS_ACL,
    REDIS_CONF,
    load_credentials,
    stack_credentials,
    with_user,
    write_redis_config,
)
from baton.devkit.servers import RedisServer
from baton.settings import Settings
from baton.store.redis_client import connect_redis
from baton.store.scripts import load_functions
from tests.helpers import five_notices_once_each


async def test_secure_stack_runs_five_notices_with_every_role_on_its_own_user(
    tmp_path: Path,
) -> None:
    async with DevStack(tmp_path, brains=1, hands=1, relays=1, secure=True, api=True) as stack:
        path = tmp_path / CREDENTIALS
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        passwords = load_credentials(tmp_path)
        assert passwords is not None and len(set(passwords.values())) == len(passwords)
        assert stack.tls is not None and stack.servers is not None
        ca = str(stack.tls.ca)
        for proc in stack.procs():  # each service got its own role's user, nobody else's
            url = proc.env["BATON_REDIS_URL"]  # and reaches both servers over TLS only
            assert url.startswith(f"rediss://{proc.role}:{passwords[proc.role]}@")
            assert proc.env["BATON_NATS_USER"] == proc.role
            assert proc.env["BATON_NATS_URL"].startswith("tls://")
            assert proc.env["BATON_REDIS_TLS_CA"] == proc.env["BATON_NATS_TLS_CA"] == ca
        assert stack.api is not None and stack.api.env["BATON_REDIS_TLS_CA"] == ca
        for name in ("ca.pem", "ca.key", "server.pem", "server.key"):
            assert stat.S_IMODE((stack.tls.ca.parent / name).stat().st_mode) == 0o600
        for name in (REDIS_ACL, REDIS_CONF):  # Redis reads its users and secrets from files
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
        # Every file of the stack holding a password is its owner's only (NATS's config too).
        holding = _files_holding(tmp_path, passwords.values())
        assert any(f.name == "nats.conf" for f in holding), holding
        assert {f: oct(stat.S_IMODE(f.stat().st_mode)) for f in holding} == {
            f: oct(0o600) for f in holding}
        for server in (stack.servers.redis, stack.servers.nats):  # never on a command line
            cmdline = _cmdline(server.pid)
            assert not [u for u, p in passwords.items() if p.encode() in cmdline]
        await five_notices_once_each(stack.settings("client"), stack.mail_url, timeout=60)

        # No anonymous access, and a role's user stays within its role.
        anonymous = aioredis.Redis.from_url(stack.redis_url, ssl_ca_certs=ca)
        with pytest.raises((AuthenticationError, ResponseError)):
            await anonymous.get("baton:x")
        await anonymous.aclose()
        hands = aioredis.Redis.from_url(stack.settings("hands").redis_url, ssl_ca_certs=ca)
        sk = (await _any_session(stack)).meta
        with pytest.raises(ResponseError, match="no permissions"):
            await hands.hset(sk, "fence", 1)
        await hands.aclose()


def _files_holding(folder: Path, secrets: Iterable[str]) -> list[Path]:
    wanted = [s.encode() for s in secrets]
    return [f for f in folder.rglob("*")
            if f.is_file() and any(s in f.read_bytes() for s in wanted)]


def _cmdline(pid: int | None) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


async def _any_session(stack: DevStack) -> object:
    from baton.store.keys import Keys

    keys = Keys(stack.namespace, stack.settings().shards)
    admin = connect_redis(stack.settings())
    try:
        for key in keys.every("sessions"):
            ids = await admin.zrange(key, 0, 0)
            if ids:
                return keys.session(ids[0])
    finally:
        await admin.aclose()
    raise AssertionError("no session")


def test_baton_dev_secure_serves_submit_and_never_prints_a_password(tmp_path: Path) -> None:
    env = {**os.environ, "BATON_HOME": str(tmp_path / "home")}

    def baton(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "baton", *args], capture_output=True,
                              text=True, timeout=90, env=env, check=False)
        assert done.returncode == 0, f"baton {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    printed = baton("dev", "up", "--secure", "--detach", "--hands", "1")
    try:
        info = json.loads((tmp_path / "home" / "dev.json").read_text())
        pids = [info["supervisor_pid"], *(p["pid"] for p in info["processes"])]
        assert info["secure"] is True
        assert info["redis_url"].startswith("rediss://")
        assert info["nats_url"].startswith("tls://")
        assert info["tls_ca"] == str(tmp_path / "home" / "tls" / "ca.pem")
        out = baton("submit", "--wait", "--json", "Send the approved notice to ada@example.com")
        assert json.loads(out.splitlines()[-1])["status"] == "completed"
        printed += out + baton("dev", "status")
        # eval "$(baton dev status --env)" keeps inspect, trace and watch on the operator's
        # credential (they read as the client: "sessions: 0 (none)")
        exported = dict(shlex.split(line)[1].split("=", 1)
                        for line in baton("dev", "status", "--env").splitlines()
                        if line.startswith("export "))
        assert "://operator:" in exported["BATON_OPERATOR_REDIS_URL"]
        assert "://client:" in exported["BATON_REDIS_URL"]
        env |= exported
        cluster = json.loads(baton("inspect", "--json").splitlines()[-1])
        assert cluster["sessions_total"] == 1, cluster
        passwords = load_credentials(tmp_path / "home") or {}
        assert passwords
        text = printed + (tmp_path / "home" / "dev.json").read_text()
        for log in (tmp_path / "home" / "logs").glob("*.log"):
            text += log.read_text(errors="replace")
        assert not [u for u, p in passwords.items() if p in text]
    finally:
        baton("dev", "down")
    assert not [pid for pid in pids if _pid_alive(pid)]


async def test_a_redis_killed_under_the_shipped_acl_restarts_with_every_commit(
    tmp_path: Path,
) -> None:
    """Redis replays its AOF as the ``default`` user and re-checks ACLs at each EXEC: with a
    ``default`` that may run nothing, every transaction (every script's effects) was dropped
    at the restart, silently. The shipped file keeps ``default`` off yet able to replay."""
    passwords = stack_credentials(tmp_path)
    conf = write_redis_config(tmp_path, "baton", passwords)
    async with RedisServer(tmp_path / "redis", durable=True) as server:
        server.config_file = conf
        server.credentials = ("admin", passwords["admin"])
        await server.restart()  # now with the users, as a secure stack starts it
        settings = Settings(redis_url=with_user(server.url, "client", passwords["client"]))
        admin = aioredis.Redis.from_url(with_user(server.url, "admin", passwords["admin"]))
        try:  # the scripts' library, which the roles may not load
            await load_functions(admin, settings)
        finally:
            await admin.aclose()
        async with await Client.connect(settings) as client:
            sub, created = await client.submit("Kept across a crash.", agent="notices")
            assert created
        before = await _keys_by_type(with_user(server.url, "admin", passwords["admin"]))
        assert any(":s:" in k for k in before), before  # the submit script's writes
        server.kill()  # appendfsync always: every acknowledged commit is on disk
        await server.restart()
        assert await _keys_by_type(with_user(server.url, "admin", passwords["admin"])) == before
        assert "NOPERM" not in (tmp_path / "redis" / server.log_name).read_text()
        anonymous = aioredis.Redis.from_url(server.url)
        try:  # and nobody logs in as default
            with pytest.raises(AuthenticationError):
                await anonymous.execute_command("AUTH", "default", "")
        finally:
            await anonymous.aclose()
        async with await Client.connect(settings) as client:
            assert await client.store.inbox.exists(sub.session_id)
            # The library came back with the data (functions are in the AOF): the role may
            # not load it, and needs not.
            _, created = await client.submit("After the crash.", agent="notices")
            assert created


async def _keys_by_type(url: str) -> dict[str, str]:
    admin = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        return {k: await admin.type(k) for k in await admin.keys("*")}
    finally:
        await admin.aclose()
