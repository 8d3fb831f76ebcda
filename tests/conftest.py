"""Shared fixtures: real Redis and NATS servers per test session, one namespace per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import NoReturn
from uuid import uuid4

import pytest
import redis.asyncio as aioredis

from baton.devkit.servers import NatsServer, RedisServer
from baton.errors import ServerBinaryMissing
from baton.settings import Settings


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


@pytest.fixture
def settings(redis_server: RedisServer, nats_server: NatsServer) -> Settings:
    """Settings pointing at the session servers, isolated by a fresh namespace."""
    return Settings(
        redis_url=redis_server.url,
        nats_url=nats_server.url,
        namespace="t" + uuid4().hex[:10],
    )


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(settings.redis_url)
    try:
        yield client
    finally:
        await client.aclose()
