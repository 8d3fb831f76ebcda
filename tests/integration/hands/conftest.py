"""The Hands modules' fixtures: a mail service, settings for a Hands (short attempt TTL, a
small output limit), and the store and bus a test plays the Brain with."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from baton.bus.bus import Bus
from baton.devkit.mailbox import MailboxServer
from baton.settings import Settings
from baton.store.store import Store


@pytest.fixture
async def mailbox() -> AsyncIterator[MailboxServer]:
    async with MailboxServer() as server:
        yield server


@pytest.fixture
def hs(settings: Settings, mailbox: MailboxServer) -> Settings:
    return settings.model_copy(update={
        "mail_url": mailbox.url, "attempt_ttl_ms": 600, "ack_wait_s": 2.0,
        "worker_name": "hands-t", "tool_output_limit": 1024,
    })


@pytest.fixture
async def store(hs: Settings) -> AsyncIterator[Store]:
    s = await Store.connect(hs)
    yield s
    await s.close()


@pytest.fixture
async def bus(hs: Settings) -> AsyncIterator[Bus]:
    async with await Bus.connect(hs, "test-brain") as b:
        await b.ensure_streams()
        yield b
