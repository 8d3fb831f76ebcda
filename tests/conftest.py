"""Shared fixtures: real Redis, NATS and S3 servers per test session, one namespace (or S3
prefix) per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, NoReturn
from uuid import uuid4

import pytest
import redis.asyncio as aioredis

from baton.devkit.redis_cluster import RedisClusterServers
from baton.devkit.servers import NatsServer, RedisServer
from baton.errors import ServerBinaryMissing
from baton.settings import Settings
from baton.store.store import Store
from tests.browser import chromium
from tests.s3_server import S3Server


def _start_failed(exc: ServerBinaryMissing) -> NoReturn:
    # Never skip: a missing server binary is a broken setup, reported with the install hint.
    pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
async def redis_server() -> AsyncIterator[RedisServer]:
    try:
        server = RedisServer()
    except ServerBinaryMissing as exc:
        _start_failed(exc)
    async with server:
        yield server


@pytest.fixture(scope="session")
async def nats_server() -> AsyncIterator[NatsServer]:
    try:
        server = NatsServer()
    except ServerBinaryMissing as exc:
        _start_failed(exc)
    async with server:
        yield server


@pytest.fixture(scope="session")
async def redis_cluster() -> AsyncIterator[RedisClusterServers]:
    """One 3+3 Redis Cluster for the whole run, started by the first test that asks for it
    (a few seconds); tests isolate themselves by namespace as on the single server."""
    async with RedisClusterServers(node_timeout_ms=2_000) as servers:
        yield servers


#: ``@pytest.mark.parametrize("topology", TOPOLOGIES)`` with the ``topo_settings`` fixture
#: runs a test on one Redis server and on a Redis Cluster.
TOPOLOGIES = ["single", "cluster"]


@pytest.fixture
def topo_settings(request: pytest.FixtureRequest, settings: Settings) -> Settings:
    """``settings``, on the Redis Cluster when the test's ``topology`` parameter says so."""
    if request.node.callspec.params.get("topology") != "cluster":
        return settings
    cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
    return settings.model_copy(update={"redis_url": cluster.seed_url})


@pytest.fixture
def settings(redis_server: RedisServer, nats_server: NatsServer) -> Settings:
    """Settings pointing at the session servers, isolated by a fresh namespace."""
    return Settings(
        redis_url=redis_server.url,
        nats_url=nats_server.url,
        namespace="t" + uuid4().hex[:10],
    )


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[Store]:
    """A :class:`Store` on ``settings``, closed after the test."""
    s = await Store.connect(settings)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(settings.redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(scope="session")
async def s3_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[S3Server]:
    """An S3-compatible server (moto's, a child process) with one bucket, for the whole run;
    started by the first test that asks for it (a few seconds)."""
    async with S3Server(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture
def s3_url(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """``s3://<bucket>/<a fresh prefix>`` on ``s3_server``, with the ``AWS_*`` variables
    that reach it set for this test (what ``Archive.from_url`` reads)."""
    for name, value in s3_server.environ().items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE"):  # would win
        monkeypatch.delenv(name, raising=False)
    return f"s3://{s3_server.bucket}/t{uuid4().hex[:10]}"


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium's WebDriver (tests.browser); the test is skipped without one."""
    yield from chromium()
