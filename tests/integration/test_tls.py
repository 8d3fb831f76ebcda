"""TLS required where configured: the servers of a secure stack refuse what is not TLS with
the stack's CA, tried with the stack's own valid passwords, one refusal per test.

One Redis and one NATS started as ``baton dev up --secure`` starts them (the stack's CA and
server certificate from :mod:`baton.devkit.tls`, the role users of deploy/'s ACL file and
NATS users, the ``default`` Redis user off). A plaintext client is refused by the server
itself, even with valid credentials; a client that does not trust the stack's CA (none given,
or another stack's) refuses the server, as it would an impostor.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError

from baton.bus.bus import Bus
from baton.devkit import secure
from baton.devkit.servers import EmbeddedStack
from baton.devkit.tls import TlsFiles, stack_tls
from baton.errors import ConfigError, NatsUnavailable
from baton.settings import Settings
from baton.store.redis_client import connect_redis

NAMESPACE = "tlstest"


@dataclass
class Secured:
    servers: EmbeddedStack
    tls: TlsFiles
    passwords: dict[str, str]
    other_ca: Path  # a CA of another stack: it signed nothing these servers present

    def settings(self, role: str = "admin", **overrides: object) -> Settings:
        env = {"BATON_REDIS_URL": self.servers.redis_url, "BATON_NATS_URL":
               self.servers.nats_url, "BATON_NAMESPACE": NAMESPACE,
               "BATON_REDIS_TLS_CA": str(self.tls.ca), "BATON_NATS_TLS_CA": str(self.tls.ca),
               "BATON_CONNECT_TIMEOUT_S": "1"}
        env |= secure.role_env(role, self.servers.redis_url, self.passwords)
        return Settings.from_env(env, **overrides)


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Secured]:
    base = tmp_path_factory.mktemp("tls-stack")
    passwords = secure.stack_credentials(base)
    files = stack_tls(base)
    other = stack_tls(tmp_path_factory.mktemp("other-stack"))
    servers = EmbeddedStack(base / "data", tls=files,
                            nats_config=secure.nats_config(NAMESPACE, passwords))
    secure.secure_redis([servers.redis], secure.write_redis_config(base, NAMESPACE, passwords),
                        passwords)
    async with servers:
        yield Secured(servers, files, passwords, other.ca)


async def test_a_trusted_tls_client_is_served(stack: Secured) -> None:
    """The baseline the refusals below are measured against."""
    redis = connect_redis(stack.settings("brain"))
    try:
        assert await redis.ping()
    finally:
        await redis.aclose()
    async with await Bus.connect(stack.settings("brain"), "tls-ok", "brain") as bus:
        assert bus.nc.is_connected


async def test_redis_refuses_a_plaintext_connection_with_valid_credentials(
    stack: Secured,
) -> None:
    # The exact bytes a plaintext client sends: the server answers none of them.
    assert await _plaintext_redis_answer(stack) == b""
    # And redis-py over redis://, as a misconfigured service would connect.
    plain = stack.settings("admin").redis_url.replace("rediss://", "redis://", 1)
    client = aioredis.Redis.from_url(plain, socket_connect_timeout=2, socket_timeout=2)
    try:
        with pytest.raises(RedisConnectionError):
            await client.ping()
    finally:
        await client.aclose()


async def _plaintext_redis_answer(stack: Secured) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", stack.servers.redis.port)
    try:
        writer.write(f"AUTH admin {stack.passwords['admin']}\r\nPING\r\n".encode())
        await writer.drain()
        async with asyncio.timeout(10):
            try:
                return await reader.read(1024)
            except ConnectionResetError:
                return b""
    finally:
        writer.close()


async def test_nats_refuses_a_plaintext_connection_with_valid_credentials(
    stack: Secured,
) -> None:
    port = stack.servers.nats.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        async with asyncio.timeout(10):
            info = json.loads((await reader.readline())[5:])
            assert info["tls_required"] is True
            connect = {"user": "relay", "pass": stack.passwords["relay"], "verbose": False,
                       "pedantic": False, "tls_required": False}
            writer.write(f"CONNECT {json.dumps(connect)}\r\nPING\r\n".encode())
            await writer.drain()
            try:  # the server takes these bytes for a TLS handshake, fails it and hangs up
                answer = await reader.read(1024)
            except ConnectionResetError:
                answer = b""
    finally:
        writer.close()
    assert answer == b"", answer  # no PONG, no session: closed unserved


@pytest.mark.parametrize("ca", ["none", "another stack's"])
async def test_redis_client_without_the_stack_ca_refuses_the_server(
    stack: Secured, ca: str,
) -> None:
    # "none": the system's CAs only.
    redis = connect_redis(stack.settings(
        "admin", redis_tls_ca=str(stack.other_ca) if ca != "none" else ""))
    try:
        with pytest.raises(RedisConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            await redis.ping()
    finally:
        await redis.aclose()


@pytest.mark.parametrize("ca", ["none", "another stack's"])
async def test_nats_client_without_the_stack_ca_refuses_the_server(
    stack: Secured, ca: str,
) -> None:
    # Long enough for the first attempt to fail on a loaded machine (nats-py then retries
    # until the deadline): the error is that attempt's, not a bare timeout.
    settings = stack.settings("relay").model_copy(update={
        "nats_tls_ca": str(stack.other_ca) if ca != "none" else "", "connect_timeout_s": 3.0})
    with pytest.raises(NatsUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        await Bus.connect(settings, "tls-untrusted", "relay")


async def test_stack_certificates_pass_strict_verification(stack: Secured) -> None:
    """Python 3.13 verifies strictly by default: the generated chain already passes."""
    ctx = stack.tls.client_context()
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", stack.servers.redis.port, ssl=ctx)
    try:
        writer.write(b"PING\r\n")
        await writer.drain()
        async with asyncio.timeout(10):
            answer = await reader.readline()
    finally:
        writer.close()
    assert answer.startswith(b"-NOAUTH"), answer  # through TLS; the default user is off


async def test_a_restarted_redis_has_its_users_again_and_tls_only(stack: Secured) -> None:
    """The users come from the stack's 0600 config file, not from commands after the start:
    a Redis process restarted alone is never open to anyone."""
    await stack.servers.redis.restart()
    anonymous = aioredis.Redis.from_url(stack.servers.redis_url, ssl_ca_certs=str(stack.tls.ca))
    try:
        with pytest.raises(AuthenticationError):
            await anonymous.ping()
    finally:
        await anonymous.aclose()
    redis = connect_redis(stack.settings("brain"))
    try:
        assert await redis.ping()
    finally:
        await redis.aclose()
    assert await _plaintext_redis_answer(stack) == b""


def test_stack_tls_is_kept_while_valid_and_made_again_when_incomplete(tmp_path: Path) -> None:
    first = stack_tls(tmp_path)
    ca = first.ca.read_bytes()
    assert stack_tls(tmp_path) == first and first.ca.read_bytes() == ca  # a restart keeps it
    first.key.unlink()
    again = stack_tls(tmp_path)
    assert again.key.is_file() and again.ca.read_bytes() != ca  # a new CA, a new chain
    assert sorted(p.name for p in again.ca.parent.iterdir()) == [
        "ca.key", "ca.pem", "hosts", "server.key", "server.pem"]
    # Other hosts (baton make-tls for a cluster's nodes): another certificate, named so.
    local = again.cert.read_bytes()
    nodes = stack_tls(tmp_path, ("nats-1", "nats-2", "10.0.0.7"))
    assert nodes.cert.read_bytes() != local
    assert (nodes.ca.parent / "hosts").read_text() == "nats-1\nnats-2\n10.0.0.7\n"
    assert stack_tls(tmp_path, ("nats-1", "nats-2", "10.0.0.7")) == nodes
    with pytest.raises(ConfigError, match="not a host name"):
        stack_tls(tmp_path, ("nats 1",))
