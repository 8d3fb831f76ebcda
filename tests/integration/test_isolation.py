"""Tools declared ``isolation="process"`` against a real Hands, Redis (password on) and NATS.

The worker's credentials are in its settings and in its environment, as in a deployment;
an isolated tool must find none of them, and its crash, hang or memory blow-up must end
only its own attempt, with a clear error result.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio as aioredis

from baton.app import Agent, App, tool
from baton.bus.bus import Bus
from baton.devkit.servers import NatsServer, RedisServer
from baton.errors import ConfigError
from baton.hands import HandsWorker
from baton.models import Task, ToolDispatch, ToolIntent, ToolResult
from baton.settings import Settings
from baton.store.store import Store, worker_ref
from baton.store.writes import Writes
from tests.helpers import eventually
from tests.isolated_apps import Nothing, bail, greet, hang, hog, segfault, shout, snoop

PASSWORD = "worker-secret-" + uuid.uuid4().hex[:8]
APP = App(agents=[Agent(name="iso", tools=("snoop",))],
          tools=[snoop, hog, hang, segfault, bail, greet, shout])
BRAIN = worker_ref("brain", "brain-iso")


@pytest.fixture(scope="module")
async def locked_redis() -> AsyncIterator[RedisServer]:
    async with RedisServer() as server:
        admin = aioredis.Redis.from_url(server.url)
        await admin.config_set("requirepass", PASSWORD)
        await admin.aclose()
        yield server


@pytest.fixture
def hs(locked_redis: RedisServer, nats_server: NatsServer,
       monkeypatch: pytest.MonkeyPatch) -> Settings:
    url = locked_redis.url.replace("redis://", f"redis://:{PASSWORD}@")
    # Where a deployed worker has them: its environment (a child would inherit them).
    monkeypatch.setenv("BATON_REDIS_URL", url)
    monkeypatch.setenv("BATON_NATS_PASSWORD", PASSWORD)
    return Settings(redis_url=url, nats_url=nats_server.url,
                    namespace="t" + uuid.uuid4().hex[:10], worker_name="hands-iso",
                    attempt_ttl_ms=600, ack_wait_s=2.0)


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[tuple[Store, Bus]]:
    store = await Store.connect(settings)
    bus = await Bus.connect(settings, "test-brain")
    await bus.ensure_streams()
    worker = HandsWorker(settings, APP)
    task = asyncio.create_task(worker.serve())
    ready = asyncio.create_task(worker.ready.wait())
    await asyncio.wait({task, ready}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    try:
        yield store, bus
    finally:
        worker.shutdown()
        await asyncio.wait_for(task, 15)
        await bus.close()
        await store.close()


async def run_tools(store: Store, bus: Bus, calls: list[tuple[str, dict[str, Any]]]
                    ) -> list[ToolResult]:
    """Commit one run per call as a Brain would, dispatch them, and wait for each result."""
    session = "s-" + uuid.uuid4().hex[:8]
    wake = bus.wake_subject("iso", 1)
    intents = [
        ToolIntent(run_id=f"run-{i}-{name}", session_id=session, task_id="task-1", tool=name,
                   arguments=arguments, operation_id=f"op-{i}", replay="unsafe",
                   wake_subject=wake)
        for i, (name, arguments) in enumerate(calls)
    ]
    await store.inbox.submit(session, agent="iso", compat=1, wake_subject=wake, request_id="r1",
                             text="go", task=Task(id="task-1", kind="generation", owner=session),
                             worker=worker_ref("client", "c"), submission_id="sub-1")
    lease = await store.acquire(session, BRAIN, 5000)
    await store.commit(session, lease.fence, Writes(runs=intents), BRAIN)
    for intent in intents:
        message = ToolDispatch(session_id=session, run_id=intent.run_id, tool=intent.tool)
        await bus.publish(bus.tool_subject(intent.tool), message.to_json().encode(),
                          msg_id=f"{session}/{intent.run_id}")

    async def result(intent: ToolIntent) -> ToolResult:
        async def completed() -> ToolResult | None:
            run = await store.runs.get(session, intent.run_id)
            return run.result if run and run.status == "completed" else None

        return await eventually(completed, timeout=60, message=f"result of {intent.tool}")

    return [await result(i) for i in intents]


async def test_an_isolated_tool_finds_no_credentials_to_use(
    hs: Settings, locked_redis: RedisServer
) -> None:
    async with serving(hs) as (store, bus):
        (seen,) = await run_tools(store, bus, [
            ("snoop", {"host": "127.0.0.1", "port": locked_redis.port})])
    assert seen.ok, seen
    out = seen.output
    # Only what the tool declares (LC_CTYPE is set by Python itself: PEP 538 coercion of the
    # C locale an empty environment implies).
    assert {k: v for k, v in out["env"].items() if k != "LC_CTYPE"} == {"ALLOWED": "declared"}
    assert not any(PASSWORD in str(v) for v in (out["env"], out["argv"], out["fds"]))
    assert not any("redis://" in a or "nats://" in a for a in out["argv"])
    # stdin, stdout (and the answer's copy), stderr, the event loop's own AF_UNIX pair:
    # no network socket of the worker's (Redis, NATS, HTTP) came along.
    assert not any("AF_INET" in target for target in out["fds"].values()), out["fds"]
    assert all(t.startswith(("pipe:", "anon_inode:", "gone:")) or t.endswith("AF_UNIX")
               for t in out["fds"].values()), out["fds"]
    assert out["ping"].startswith("-NOAUTH"), out["ping"]  # the worker's Redis, unreachable
    assert PASSWORD not in out["settings_redis"]


async def test_crashes_hangs_and_memory_blowups_end_only_their_attempt(hs: Settings) -> None:
    async with serving(hs) as (store, bus):
        hogged, hung, crashed, bailed = await run_tools(store, bus, [
            ("hog", {}), ("hang", {}), ("segfault", {}), ("bail", {})])
        after, by_hand = await run_tools(store, bus, [("greet", {"text": "still serving"}),
                                                      ("shout", {"text": "hi"})])

    assert (hogged.outcome, hogged.error_code) == ("error", "tool_memory_limit")
    assert "64 MB" in (hogged.error or "")
    assert (hung.outcome, hung.error_code) == ("error", "tool_timeout")
    assert "wall time" in (hung.error or "")
    assert (crashed.outcome, crashed.error_code) == ("error", "tool_crashed")
    assert "SIGSEGV" in (crashed.error or "")
    assert (bailed.outcome, bailed.error_code) == ("error", "tool_crashed")
    assert "status 1" in (bailed.error or "") and "bailing out" in (bailed.error or "")
    assert after.ok and after.output == {"greeting": "hello still serving"}
    assert by_hand.ok and by_hand.output == "HI"


def test_isolation_options_are_checked_where_the_tool_is_declared() -> None:
    with pytest.raises(ConfigError, match="need isolation='process'"):
        tool(memory_mb=64)(plain)

    def local() -> None:
        @tool(isolation="process")
        async def nested(args: Nothing, ctx: Any) -> None: ...

    with pytest.raises(ConfigError, match="importable by module path"):
        local()


async def plain(args: Nothing, ctx: Any) -> None:
    return None
