"""Fixtures of the integration tests beyond the servers of tests/conftest.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from baton.devkit.mailbox import MailboxServer
from tests.integration.confinement import Confined, confined_redis
from tests.model_server import ModelServer


@pytest.fixture(scope="module")
async def confined() -> AsyncIterator[Confined]:
    """A private Redis with the users of the deploy ACL file (tests/integration/confinement.py),
    one per test module."""
    async with confined_redis() as c:
        yield c


@pytest.fixture
async def mailbox() -> AsyncIterator[MailboxServer]:
    """The bundled mail service, answering at once (a module may override it: see
    test_cluster.py)."""
    async with MailboxServer() as server:
        yield server


@pytest.fixture
async def model_server() -> AsyncIterator[ModelServer]:
    """A scripted OpenAI- and Anthropic-compatible model over real HTTP (tests.model_server)."""
    async with ModelServer() as server:
        yield server
