"""The Hands' test app (tools with counters and hooks) and helpers, shared by the Hands
modules (``tests/integration/hands``, whose conftest has their fixtures) and others: runs
are committed through the Store as a Brain would, and their tool messages published
directly (the relay's job) with ``Bus.publish``; the worker runs in-process as a task."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from pydantic import BaseModel

from baton.app import Agent, App, ToolContext, tool
from baton.brain.requests import request_writes
from baton.bus.bus import Bus
from baton.hands import HandsWorker
from baton.hands.tools import http_get, send_email
from baton.models import OutboxRow, Task, ToolDispatch, ToolIntent, ToolResult
from baton.settings import Settings
from baton.store.outbox import Outbox
from baton.store.state import Claim
from baton.store.store import Store, worker_ref
from tests.helpers import eventually

BRAIN = worker_ref("brain", "brain-t")
DEAD_HANDS = worker_ref("hands", "hands-x")
OTHER_HANDS = worker_ref("hands", "hands-b")

# ---------------------------------------------------------------- the test app

CALLS: Counter[str] = Counter()  # run id -> times the tool body ran
HOOKS: dict[str, Callable[[ToolContext], Awaitable[Any]]] = {}  # run id -> gate behaviour


class TextArgs(BaseModel):
    text: str = ""


class ChargeArgs(BaseModel):
    amount: int


@tool(replay="safe")
async def echo(args: TextArgs, ctx: ToolContext) -> dict[str, Any]:
    """Return the text (no outside effect)."""
    CALLS[ctx.run_id] += 1
    return {"echo": args.text}


@tool(replay="unsafe")
async def charge(args: ChargeArgs, ctx: ToolContext) -> dict[str, Any]:
    """Charge a card: not safe to repeat."""
    CALLS[ctx.run_id] += 1
    return {"charged": args.amount}


@tool
async def boom(args: TextArgs, ctx: ToolContext) -> None:
    """Always raises."""
    raise RuntimeError("kaboom")


@tool(replay="safe")
async def quits(args: TextArgs, ctx: ToolContext) -> None:
    """Ends its process (its text says how): a tool bug that must stay the tool's."""
    if args.text == "generator":
        raise GeneratorExit()
    raise SystemExit(3) if args.text == "exit" else KeyboardInterrupt()


@tool(timeout=0.2)
async def slow(args: TextArgs, ctx: ToolContext) -> None:
    """Never finishes in time."""
    await asyncio.Event().wait()


ACTED: dict[str, dict[str, Any]] = {}  # run id -> what slow_send did before it stalled


@tool(replay="confirm", timeout=0.5)
async def slow_send(args: TextArgs, ctx: ToolContext) -> dict[str, Any]:
    """Acts (when its text is "acts") and then never answers: the provider took the mail
    but its reply never came."""
    CALLS[ctx.run_id] += 1
    if args.text == "acts":
        ACTED[ctx.operation_id] = {"sent": ctx.operation_id}
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


CONFIRM_DOWN: set[str] = set()  # operation ids whose confirm cannot reach the provider
CONFIRM_FAILED: Counter[str] = Counter()  # operation id -> confirms that failed


@slow_send.confirm
async def slow_send_happened(operation_id: str, args: TextArgs,
                             ctx: ToolContext) -> dict[str, Any] | None:
    if operation_id in CONFIRM_DOWN:
        CONFIRM_FAILED[operation_id] += 1
        raise ConnectionError("the provider is down")
    return ACTED.get(operation_id)


@tool(replay="confirm", timeout=60.0, name="held_send")
async def held_send(args: TextArgs, ctx: ToolContext) -> dict[str, Any]:
    """slow_send with time to be cancelled before its deadline."""
    return await slow_send.fn(args, ctx)  # type: ignore[no-any-return]


held_send.confirm(slow_send_happened)


@tool
async def big(args: TextArgs, ctx: ToolContext) -> str:
    """Answers far more than the output limit."""
    return "x" * 10_000


@tool
async def gate(args: TextArgs, ctx: ToolContext) -> Any:
    """Does what the test registered for this run."""
    CALLS[ctx.run_id] += 1
    return await HOOKS[ctx.run_id](ctx)


APP = App(
    agents=[Agent(name="notices", tools=("send_email",))],
    tools=[send_email, http_get, echo, charge, boom, quits, slow, slow_send, held_send, big, gate],
)

# ---------------------------------------------------------------- fixtures and helpers


@asynccontextmanager
async def running(settings: Settings, tools: list[str] | None = None) -> AsyncIterator[HandsWorker]:
    worker = HandsWorker(settings, APP, tools)
    serving = asyncio.create_task(worker.serve())
    ready = asyncio.create_task(worker.ready.wait())
    await asyncio.wait({serving, ready}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    if serving.done():
        serving.result()  # raises what broke the start
    assert worker.ready.is_set()
    try:
        yield worker
    finally:
        worker.shutdown()
        await asyncio.wait_for(serving, 15)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def make_intent(
    bus: Bus, session: str, tool_name: str, arguments: dict[str, Any],
    *, replay: str | None = None, group: str | None = None,
) -> ToolIntent:
    run_id = new_id("run")
    declared = APP.tools.get(tool_name)
    return ToolIntent(
        run_id=run_id, session_id=session, task_id="task-1", tool=tool_name,
        arguments=arguments, operation_id=f"op-{run_id}", group=group,
        replay=replay or (declared.replay if declared else "unsafe"),  # type: ignore[arg-type]
        wake_subject=bus.wake_subject("notices", 1),
    )


async def commit_runs(
    store: Store, bus: Bus, session: str, intents: list[ToolIntent],
    groups: dict[str, int] | None = None,
) -> None:
    """What a Brain does: accept a submission, then commit the tool runs under its lease."""
    await store.inbox.submit(
        session, agent="notices", compat=1, wake_subject=bus.wake_subject("notices", 1),
        request_id="r1", text="go", task=Task(id="task-1", kind="generation", owner=session),
        worker=worker_ref("client", "c"), submission_id="sub-1",
    )
    lease, state = await store.acquire_and_load(session, BRAIN, 5000)
    writes, _, _ = request_writes(state)  # the submission taken up, in the same commit
    writes.runs, writes.groups = intents, groups or {}
    await store.commit(session, lease.fence, writes, BRAIN)


async def dispatch(bus: Bus, intent: ToolIntent, *, msg_id: str | None = None,
                   subject_tool: str | None = None) -> None:
    message = ToolDispatch(session_id=intent.session_id, run_id=intent.run_id, tool=intent.tool)
    await bus.publish(bus.tool_subject(subject_tool or intent.tool), message.to_json().encode(),
                      msg_id=msg_id or f"{intent.session_id}/{intent.run_id}")


async def result_of(store: Store, intent: ToolIntent, timeout: float = 10.0) -> ToolResult:  # noqa: ASYNC109
    async def completed() -> ToolResult | None:
        run = await store.runs.get(intent.session_id, intent.run_id)
        return run.result if run and run.status == "completed" else None

    return await eventually(completed, timeout=timeout, message=f"result of {intent.tool}")


async def settled(bus: Bus, *tools: str) -> None:
    """Every message of these tools' consumers was acked (or terminated)."""
    js = bus.nc.jetstream()

    async def clean() -> bool:
        for name in tools:
            info = await js.consumer_info(bus.names.tool_stream, bus.names.tool_durable(name))
            if info.num_pending or info.num_ack_pending:
                return False
        return True

    await eventually(clean, timeout=10, message="all tool messages acked")


async def abandon(store: Store, intent: ToolIntent) -> Claim:
    """An earlier attempt by a Hands that died: claimed, then its heartbeat runs out."""
    claim = await store.runs.claim(intent.session_id, intent.run_id, DEAD_HANDS)
    assert claim.status == "claimed" and claim.attempt == 1
    ttl = store.settings.attempt_ttl_ms

    async def expired() -> bool:
        run = await store.runs.get(intent.session_id, intent.run_id)
        seconds, micros = await store.redis.time()
        assert run and run.heartbeat_ms
        return run.heartbeat_ms + ttl < seconds * 1000 + micros // 1000

    await eventually(expired, message="earlier attempt's heartbeat expired")
    return claim


async def outbox_rows(store: Store, session: str) -> list[OutboxRow]:
    box = Outbox(store.redis, store.keys)
    shard = store.keys.shard_of(session)
    await box.ensure_groups([shard])
    return await box.read([shard], "reader", 100, None)
