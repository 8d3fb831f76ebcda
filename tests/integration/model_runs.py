"""Five-notice runs against tests.model_server's HTTP models, with Brain, Hands and Relay in
the test's event loop (tests/integration/test_models.py, test_model_failures.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from baton.app import App
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.models import Entry, Submission, Task
from baton.receipts import Receipt
from baton.settings import Settings
from baton.store.state import Partial
from tests.helpers import running, trio
from tests.model_apps import anthropic_app, openai_app
from tests.model_server import ModelServer

FIVE = ("Send the approved notice to ada@example.com, grace@example.com, linus@example.com, "
        "margaret@example.com and barbara@example.com, then summarise.")
APPS = {"openai": openai_app, "anthropic": anthropic_app}


def model_settings(settings: Settings, server: ModelServer, **extra: Any) -> Settings:
    return settings.model_copy(update={
        "openai_base_url": server.openai_url, "openai_api_key": server.key,
        "anthropic_base_url": server.anthropic_url, "anthropic_api_key": server.key,
        "model_backoff_ms": 200, "model_read_timeout_s": 5.0, **extra,
    })


@dataclass
class Outcome:
    """A settled submission and what the tests check about it."""

    final: Submission
    entries: list[Entry]
    receipts: list[Receipt]
    task: Task
    partial: Partial | None  # streamed text left after the final commit (none expected)

    def step(self, name: str) -> Receipt:
        return next(r for r in self.receipts if getattr(r.detail, "step", None) == name)


Check = Callable[[Client, Submission], Awaitable[None]]


async def run_notices(settings: Settings, app: App, mailbox: MailboxServer,
                      *, check: Check | None = None) -> Outcome:
    """Submit the five notices with Brain, Hands and Relay in this loop; wait until settled."""
    settings = settings.model_copy(update={"mail_url": mailbox.url})
    async with running(*trio(settings, app)):
        client = await Client.connect(settings)
        try:
            sub, _ = await client.submit(FIVE, agent="notices")
            if check is not None:
                await check(client, sub)
            final = await client.wait(sub, timeout=30)
            store, sid = client.store, sub.session_id
            return Outcome(final, await store.entries(sid), await store.receipts(sid),
                           await store.inbox.task(sid, sub.task_id), await store.partial(sid))
        finally:
            await client.close()


async def mail_stats(mailbox: MailboxServer) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        return dict((await http.get(f"{mailbox.url}/stats")).json())


def kinds(entries: list[Entry]) -> list[str]:
    return [e.kind for e in entries]
