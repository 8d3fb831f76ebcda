"""The client side: submit input to a session and wait for its submission to settle.

Clients never take leases: they write only through the idempotent ``submit`` script and
read committed state.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid

from shared.bus import BusNames
from shared.errors import ConfigError
from shared.faults import Faults
from shared.models import Submission, Task
from shared.settings import Settings
from shared.store import Store, now_ms, worker_ref

GENERATION = "generation"


def derived_id(prefix: str, *parts: str) -> str:
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:20]
    return f"{prefix}-{digest}"


class Client:
    """Submit and wait; one per process, shares the store connection."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.names = BusNames(settings.namespace)
        self.worker = worker_ref("client", settings.worker_id("client"))
        self.faults = Faults(settings.fault)

    @classmethod
    async def connect(cls, settings: Settings) -> Client:
        return cls(await Store.connect(settings), settings)

    async def close(self) -> None:
        await self.store.close()

    async def submit(
        self,
        text: str,
        *,
        agent: str,
        compat: int = 1,
        session_id: str | None = None,
        request_id: str | None = None,
    ) -> tuple[Submission, bool]:
        """Accept ``text`` once per request id; returns (submission, created)."""
        if not text.strip():
            raise ConfigError("nothing to submit: the text is empty")
        session_id = session_id or f"s-{uuid.uuid4().hex[:16]}"
        request_id = request_id or uuid.uuid4().hex
        sub_id = derived_id("sub", session_id, request_id)
        task = Task(
            id=derived_id("gen", session_id, request_id),
            kind=GENERATION,
            owner=session_id,
            submission_id=sub_id,
            input={"agent": agent},
            created_ms=now_ms(),
        )
        result = await self.store.submit(
            session_id,
            agent=agent,
            compat=compat,
            wake_subject=self.names.wake_subject(agent, compat),
            request_id=request_id,
            text=text,
            task=task,
            worker=self.worker,
            submission_id=sub_id,
        )
        self.faults.hit("submit.after_commit")
        return result

    async def wait(self, submission: Submission, timeout: float = 60.0) -> Submission:  # noqa: ASYNC109
        """Wait until the submission settles (completed, failed or cancelled)."""
        channel = self.store.keys.settled_channel(submission.session_id)
        pubsub = self.store.redis.pubsub()
        await pubsub.subscribe(channel)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    current = await self.store.submission(submission.session_id, submission.id)
                    if current.settled:
                        return current
                    # Wake on a notification, or re-check at least every second.
                    await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
        finally:
            await pubsub.unsubscribe(channel)
            await pubsub.aclose()
