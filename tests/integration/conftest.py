"""Fixtures of the integration tests beyond the servers of tests/conftest.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.integration.confinement import Confined, confined_redis


@pytest.fixture(scope="module")
async def confined() -> AsyncIterator[Confined]:
    """A private Redis with the users of the deploy ACL file (tests/integration/confinement.py),
    one per test module."""
    async with confined_redis() as c:
        yield c
