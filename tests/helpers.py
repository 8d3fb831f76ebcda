"""Test helpers: wait on a condition with a deadline instead of sleeping; read what a Redis key
holds as data, to compare before and after an act."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any


async def eventually(
    predicate: Callable[[], Any | Awaitable[Any]],
    # A deadline for a broken run, not a timing: a loaded machine (the suite beside CPU hogs,
    # two test workers on two cores) may take many seconds for what takes milliseconds idle.
    timeout: float = 30.0,  # noqa: ASYNC109 - a polling deadline, reported in the failure
    interval: float = 0.01,
    message: str = "",
) -> Any:
    """Poll ``predicate`` (sync or async) until it returns a truthy value; return that value.

    Raises AssertionError naming the predicate and its last value (or exception) on timeout.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = predicate()
            if inspect.isawaitable(last):
                last = await last
        except AssertionError as exc:  # predicates may assert; keep polling
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            name = getattr(predicate, "__qualname__", repr(predicate))
            raise AssertionError(
                f"{message or 'condition'} not met within {timeout}s "
                f"({name}; last value: {last!r})"
            )
        await asyncio.sleep(interval)


@asynccontextmanager
async def running(*services: Any) -> AsyncIterator[None]:
    """Serve Baton services (Brain, Hands, Relay ...) in this event loop while in the block."""
    tasks = [asyncio.create_task(s.serve()) for s in services]
    try:
        # A bound for a broken start, not a timing: on a loaded machine a service that starts
        # child processes (MCP servers) may take many seconds to be ready.
        await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in services)), 60)
        yield
    finally:
        for s in services:
            s.shutdown()
        await asyncio.gather(*tasks, return_exceptions=True)


def trio(settings: Any, app: Any) -> tuple[Any, Any, Any]:
    """A Relay, a Hands and a Brain of ``settings`` serving ``app``, named relay-1, hands-1
    and brain-1: what ``running(*trio(settings, app))`` serves in this event loop."""
    from baton.brain.worker import BrainWorker
    from baton.hands.worker import HandsWorker
    from baton.relay.worker import Relay

    def named(name: str) -> Any:
        return settings.model_copy(update={"worker_name": name})

    return Relay(named("relay-1")), HandsWorker(named("hands-1"), app), \
        BrainWorker(named("brain-1"), app)


async def take_up(store: Any, session_id: str, worker: Any = None) -> None:
    """Do what a Brain does with a session's waiting submit and start requests (open the
    session, commit their records), for tests that drive the store without a Brain."""
    from baton.brain.requests import request_writes
    from baton.models import WorkerRef

    worker = worker or WorkerRef(name="brain-take-up", role="brain", pid=0)
    lease, state = await store.acquire_and_load(session_id, worker, 5000)
    writes, _, _ = request_writes(state)
    if writes.tasks:  # as a Brain's commit: live tasks keep the progress deadline armed
        writes.deadline_ms = store.settings.progress_deadline_ms
    if writes:
        await store.commit(session_id, lease.fence, writes, worker)
    await store.release(session_id, lease.fence, 5000)


async def five_notices_once_each(settings: Any, mail_url: str, timeout: float) -> None:  # noqa: ASYNC109
    """Submit the five-notice request through a client of ``settings``, wait for it to
    complete and check that the mail service delivered exactly one mail per recipient."""
    import httpx

    from baton.client import Client
    from baton.devkit.demo import FIVE_NOTICES

    client = await Client.connect(settings)
    try:
        sub, _ = await client.submit(FIVE_NOTICES, agent="notices")
        final = await client.wait(sub, timeout=timeout)
    finally:
        await client.close()
    assert final.status == "completed", final
    async with httpx.AsyncClient() as http:
        stats = (await http.get(f"{mail_url}/stats")).json()
    assert sorted(stats["deliveries"].values()) == [1] * 5


# A key's whole value by its type, as data. DUMP's bytes are no way to tell a key unchanged:
# a hash of long values is a hash table, and DUMP follows its iteration order, which a
# rehash in progress changes without any write.
_READ_WHOLE = {"hash": ("HGETALL",), "list": ("LRANGE", 0, -1), "stream": ("XRANGE", "-", "+"),
               "zset": ("ZRANGE", 0, -1, "WITHSCORES"), "set": ("SMEMBERS",), "string": ("GET",)}


def _held(kind: str, value: Any) -> Any:
    if kind == "hash":
        return sorted(value.items())
    if kind == "set":
        return sorted(value)
    return value


def _kind(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


async def contents(r: Any, key: str) -> tuple[str, Any]:
    """``key``'s type and what it holds (an asyncio client)."""
    kind = _kind(await r.type(key))
    if kind not in _READ_WHOLE:
        return kind, None
    command, *args = _READ_WHOLE[kind]
    return kind, _held(kind, await r.execute_command(command, key, *args))


def contents_sync(r: Any, key: str) -> tuple[str, Any]:
    """:func:`contents` with a blocking client."""
    kind = _kind(r.type(key))
    if kind not in _READ_WHOLE:
        return kind, None
    command, *args = _READ_WHOLE[kind]
    return kind, _held(kind, r.execute_command(command, key, *args))
