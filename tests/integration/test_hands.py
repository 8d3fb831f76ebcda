"""The Hands worker against real Redis, NATS and the bundled mail service.

Runs are committed through the Store as a Brain would, and their tool messages published
directly (the relay's job) with ``Bus.publish``; the worker runs in-process as a task.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from baton.app import Agent, App, ToolContext, tool
from baton.brain.requests import request_writes
from baton.bus.bus import Bus
from baton.devkit.mailbox import MailboxServer
from baton.errors import ConfigError, RedisUnavailable, StaleAttemptError, ToolMismatchError
from baton.hands import HandsWorker
from baton.hands.tools import http_get, send_email
from baton.models import OutboxRow, Task, ToolDispatch, ToolIntent, ToolResult
from baton.settings import Settings
from baton.store.deadletter import dead_letters
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


@tool(timeout=0.2)
async def slow(args: TextArgs, ctx: ToolContext) -> None:
    """Never finishes in time."""
    await asyncio.Event().wait()


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
    tools=[send_email, http_get, echo, charge, boom, slow, big, gate],
)

# ---------------------------------------------------------------- fixtures and helpers


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
    await store.submit(
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


# ---------------------------------------------------------------- happy path


async def test_send_email_completes_once_and_wakes_after_the_group(
    hs: Settings, store: Store, bus: Bus, mailbox: MailboxServer
) -> None:
    session = new_id("s")
    intents = [
        make_intent(bus, session, "send_email",
                    {"to": f"c{i}@example.com", "subject": "Notice", "body": "Hello"}, group="g")
        for i in range(2)
    ]
    await commit_runs(store, bus, session, intents, groups={"g": 2})
    async with running(hs):
        await dispatch(bus, intents[0])
        first = await result_of(store, intents[0])
        assert not any('"tool:' in r.data for r in await outbox_rows(store, session))
        await dispatch(bus, intents[1])
        second = await result_of(store, intents[1])
        await settled(bus, "send_email")

    for intent, result in zip(intents, (first, second), strict=True):
        assert result.ok and result.recovery == "none" and result.attempt == 1
        assert result.output["status"] == "delivered"
        assert result.output["operation_id"] == intent.operation_id
    assert mailbox.raw_requests == 2 and len(mailbox.operations) == 2
    marks = {(m.run_id, m.mark) for r in await store.receipts(session) for m in r.marks}
    for intent in intents:
        assert {(intent.run_id, "accepted"), (intent.run_id, "completed")} <= marks
    wakes = [r for r in await outbox_rows(store, session) if '"tool:' in r.data]
    assert len(wakes) == 1 and intents[1].run_id in wakes[0].data  # the group's last one


async def test_a_duplicate_tool_message_executes_once(
    hs: Settings, store: Store, bus: Bus, mailbox: MailboxServer
) -> None:
    session = new_id("s")
    intent = make_intent(bus, session, "send_email",
                         {"to": "a@example.com", "subject": "Notice", "body": "Hello"})
    await commit_runs(store, bus, session, [intent])
    async with running(hs):
        await dispatch(bus, intent, msg_id="first")
        await dispatch(bus, intent, msg_id="second")  # not deduplicated by the stream
        result = await result_of(store, intent)
        await settled(bus, "send_email")
    assert result.ok and result.attempt == 1
    assert mailbox.raw_requests == 1 and len(mailbox.operations) == 1
    run = await store.runs.get(session, intent.run_id)
    assert run and run.attempt == 1


# ---------------------------------------------------------------- recovery per policy


async def test_confirm_adopts_a_send_that_already_happened(
    hs: Settings, store: Store, bus: Bus, mailbox: MailboxServer
) -> None:
    session = new_id("s")
    args = {"to": "d@example.com", "subject": "Notice", "body": "Hello"}
    intent = make_intent(bus, session, "send_email", args)
    await commit_runs(store, bus, session, [intent])
    await abandon(store, intent)
    async with httpx.AsyncClient() as http:  # the dead attempt's send reached the provider
        sent = await http.post(f"{mailbox.url}/send", json=args,
                               headers={"Idempotency-Key": intent.operation_id})
    assert sent.status_code == 200
    async with running(hs):
        await dispatch(bus, intent)
        result = await result_of(store, intent)
        await settled(bus, "send_email")
    assert result.ok and result.recovery == "confirmed" and result.attempt == 2
    assert result.output["message_id"] == sent.json()["message_id"]
    assert mailbox.raw_requests == 1  # confirmed, never re-sent
    reclaims = [r for r in await store.receipts(session) if r.kind == "reclaim"]
    assert reclaims and reclaims[0].detail.previous_worker == "hands-x"


async def test_confirm_with_nothing_found_executes_once(
    hs: Settings, store: Store, bus: Bus, mailbox: MailboxServer
) -> None:
    session = new_id("s")
    intent = make_intent(bus, session, "send_email",
                         {"to": "e@example.com", "subject": "Notice", "body": "Hello"})
    await commit_runs(store, bus, session, [intent])
    await abandon(store, intent)
    async with running(hs):
        await dispatch(bus, intent)
        result = await result_of(store, intent)
    assert result.ok and result.recovery == "executed_after_confirm"
    assert mailbox.raw_requests == 1 and list(mailbox.operations) == [intent.operation_id]


async def test_a_safe_tool_is_reexecuted(
    hs: Settings, store: Store, bus: Bus, mailbox: MailboxServer
) -> None:
    session = new_id("s")
    intent = make_intent(bus, session, "http_get", {"url": f"{mailbox.url}/healthz"})
    await commit_runs(store, bus, session, [intent])
    await abandon(store, intent)
    async with running(hs):
        await dispatch(bus, intent)
        result = await result_of(store, intent)
    assert result.ok and result.recovery == "reexecuted"
    assert result.output["status"] == 200 and '"ok"' in result.output["text"]


async def test_unsafe_and_weakened_tools_are_interrupted_without_running(
    hs: Settings, store: Store, bus: Bus
) -> None:
    session = new_id("s")
    unsafe = make_intent(bus, session, "charge", {"amount": 5})
    # Saved while the tool still said "safe"; the code running now says "unsafe".
    weakened = make_intent(bus, session, "charge", {"amount": 7}, replay="safe")
    await commit_runs(store, bus, session, [unsafe, weakened])
    for intent in (unsafe, weakened):
        await abandon(store, intent)
    async with running(hs):
        for intent in (unsafe, weakened):
            await dispatch(bus, intent)
        results = [await result_of(store, i) for i in (unsafe, weakened)]
        await settled(bus, "charge")
    for intent, result in zip((unsafe, weakened), results, strict=True):
        assert result.outcome == "interrupted" and result.recovery == "interrupted"
        assert "not safe to replay" in (result.error or "")
        assert CALLS[intent.run_id] == 0
    assert "changed from 'safe' to 'unsafe'" in (results[1].error or "")
    # Not ok: each one wakes the Brain even outside a group.
    wakes = [r for r in await outbox_rows(store, session) if '"tool:' in r.data]
    assert len(wakes) == 2


async def test_recovery_on_the_last_delivery_fails_instead_of_executing(
    hs: Settings, store: Store, bus: Bus
) -> None:
    settings = hs.model_copy(update={"max_deliver": 1})
    session = new_id("s")
    intent = make_intent(bus, session, "echo", {"text": "hi"})
    await commit_runs(store, bus, session, [intent])
    await abandon(store, intent)
    async with running(settings, tools=["echo"]):
        await dispatch(bus, intent)
        result = await result_of(store, intent)
        await settled(bus, "echo")
    assert result.outcome == "failed" and result.error_code == "max_deliveries"
    assert "1 deliveries without a result" in (result.error or "")
    assert CALLS[intent.run_id] == 0


# ---------------------------------------------------------------- errors are results


async def test_errors_become_results_and_the_worker_keeps_serving(
    hs: Settings, store: Store, bus: Bus, mailbox: MailboxServer
) -> None:
    session = new_id("s")
    invalid = make_intent(bus, session, "send_email", {"to": "not-an-address"}, group="g")
    raising = make_intent(bus, session, "boom", {}, group="g")
    timing_out = make_intent(bus, session, "slow", {}, group="g")
    huge = make_intent(bus, session, "big", {}, group="g")
    after = make_intent(bus, session, "echo", {"text": "still here"}, group="g")
    everything = [invalid, raising, timing_out, huge, after]
    unknown = make_intent(bus, session, "ghost", {})  # a run for a tool no app declares
    await commit_runs(store, bus, session, [*everything, unknown],
                      groups={"g": len(everything)})
    async with running(hs):
        await bus.publish(bus.tool_subject("echo"), b"{not json", msg_id="garbage")
        await bus.publish(bus.tool_subject("echo"), b'{"v": 9, "session_id": "s"}', msg_id="v9")
        for intent in (invalid, raising, timing_out, huge):
            await dispatch(bus, intent)
        # A message naming a tool this app does not declare, on a served tool's subject.
        await dispatch(bus, unknown, subject_tool="echo")
        ghost_run = ToolDispatch(session_id=session, run_id="no-such-run", tool="echo")
        await bus.publish(bus.tool_subject("echo"), ghost_run.to_json().encode(), msg_id="gone")
        results = {i.run_id: await result_of(store, i) for i in everything[:-1]}
        await dispatch(bus, after)
        last = await result_of(store, after)
        await settled(bus, "send_email", "echo", "boom", "slow", "big")

    codes = {i.tool: (results[i.run_id].outcome, results[i.run_id].error_code)
             for i in everything[:-1]}
    assert codes == {
        "send_email": ("error", "invalid_arguments"),
        "boom": ("error", "tool_exception"),
        "slow": ("error", "timeout"),
        "big": ("ok", None),
    }
    assert "to" in (results[invalid.run_id].error or "")
    assert "kaboom" in (results[raising.run_id].error or "")
    truncated = results[huge.run_id]
    assert truncated.truncated and "[truncated" in truncated.output
    assert len(truncated.output) < 1200
    assert last.ok and last.output == {"echo": "still here"}
    assert mailbox.raw_requests == 0
    # Error results wake the Brain at once; the group's last completion wakes it too.
    wakes = [r.data for r in await outbox_rows(store, session) if '"tool:' in r.data]
    for intent in (invalid, raising, timing_out, after):
        assert any(intent.run_id in w for w in wakes), intent.tool
    assert not any(huge.run_id in w for w in wakes)
    ghost = await store.runs.get(session, unknown.run_id)  # misaddressed: never claimed
    assert ghost is not None and ghost.status == "dispatched" and ghost.attempt == 0
    reasons = sorted(d["reason"] for d in await dead_letters(store.redis, store.keys))
    assert len(reasons) == 4 and "unknown run" in reasons
    assert any("malformed" in r or "invalid ToolDispatch" in r for r in reasons)
    assert any("tool mismatch" in r and "ghost" in r for r in reasons)


async def test_a_tool_message_on_another_tools_subject_never_touches_the_run(
    hs: Settings, store: Store, bus: Bus, mailbox: MailboxServer
) -> None:
    """The attack: a real send_email run's message re-addressed to http_get's subject."""
    session = new_id("s")
    mail = make_intent(bus, session, "send_email",
                       {"to": "c@example.com", "subject": "Notice", "body": "Hello"})
    await commit_runs(store, bus, session, [mail])
    forged = ToolDispatch(session_id=session, run_id=mail.run_id, tool="send_email")
    relabelled = ToolDispatch(session_id=session, run_id=mail.run_id, tool="http_get")
    async with running(hs, tools=["http_get"]):
        # The message names send_email but came on http_get's subject.
        await bus.publish(bus.tool_subject("http_get"), forged.to_json().encode(),
                          msg_id="forged")
        # Subject and message agree on http_get; the committed intent says send_email:
        # claim.lua refuses before any write.
        await bus.publish(bus.tool_subject("http_get"), relabelled.to_json().encode(),
                          msg_id="relabelled")
        await settled(bus, "http_get")

    run = await store.runs.get(session, mail.run_id)
    assert run is not None and run.status == "dispatched" and run.attempt == 0
    assert run.accepted_ms is None and run.result is None
    assert not [r for r in await store.receipts(session) if r.kind in ("claim", "reclaim")]
    letters = await dead_letters(store.redis, store.keys)
    reasons = {d["payload"]: d["reason"] for d in letters}
    assert "subject" in reasons[forged.to_json()] and "http_get" in reasons[forged.to_json()]
    committed = reasons[relabelled.to_json()]
    assert "tool mismatch" in committed and "'send_email'" in committed
    assert all(d["subject"] == bus.tool_subject("http_get") for d in letters)
    with pytest.raises(ToolMismatchError) as refused:  # the script's own check, directly
        await store.runs.claim(session, mail.run_id, OTHER_HANDS, tool="http_get")
    assert refused.value.committed == "send_email"

    async with running(hs, tools=["send_email"]):  # the real run is executed, once
        await dispatch(bus, mail)
        result = await result_of(store, mail)
        await settled(bus, "send_email")
    assert result.ok and result.attempt == 1 and result.output["status"] == "delivered"
    assert mailbox.raw_requests == 1 and len(mailbox.operations) == 1


def test_serving_an_undeclared_tool_is_a_config_error(settings: Settings) -> None:
    with pytest.raises(ConfigError, match="nope"):
        HandsWorker(settings, APP, ["echo", "nope"])


# ---------------------------------------------------------------- stale Hands


async def _take_over(store: Store, intent: ToolIntent) -> Claim:
    """A paused worker's heartbeat lapses and another Hands claims the run."""
    sk = store.keys.session(intent.session_id)
    await store.redis.hset(sk.runs, f"{intent.run_id}.heartbeat", 0)
    claim = await store.runs.claim(intent.session_id, intent.run_id, OTHER_HANDS, delivery=2)
    assert claim.status == "claimed" and claim.recovering
    return claim


async def test_a_taken_over_attempt_is_cancelled_and_never_completes(
    hs: Settings, store: Store, bus: Bus
) -> None:
    session = new_id("s")
    intent = make_intent(bus, session, "gate", {})
    await commit_runs(store, bus, session, [intent])
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def hold(ctx: ToolContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    HOOKS[intent.run_id] = hold
    async with running(hs, tools=["gate"]):
        await dispatch(bus, intent)
        await asyncio.wait_for(started.wait(), 10)
        second = await _take_over(store, intent)
        await asyncio.wait_for(cancelled.wait(), 10)  # the heartbeat saw the takeover
        winner = ToolResult(outcome="ok", output={"by": "hands-b"}, attempt=second.attempt)
        await store.runs.complete(session, intent, second.attempt, winner, OTHER_HANDS)
        # The old message comes back after ack_wait and is acked as a duplicate.
        await settled(bus, "gate")
    assert (await result_of(store, intent)) == winner
    # The stale attempt learnt of the takeover from its heartbeat (a traced refusal) and
    # never tried to complete.
    refused = [r for r in await store.receipts(session) if r.kind == "refused"]
    assert refused and {r.detail.op for r in refused} == {"heartbeat"}
    assert CALLS[intent.run_id] == 1


async def test_a_stale_attempts_complete_is_refused_and_the_new_result_stands(
    hs: Settings, store: Store, bus: Bus
) -> None:
    session = new_id("s")
    intent = make_intent(bus, session, "gate", {})
    await commit_runs(store, bus, session, [intent])
    taken: list[Claim] = []

    async def lose_the_run(ctx: ToolContext) -> dict[str, str]:
        taken.append(await _take_over(store, intent))  # paused past the ttl, then resumes
        return {"by": "hands-t"}

    HOOKS[intent.run_id] = lose_the_run

    async def refused() -> bool:
        return any(r.kind == "refused" for r in await store.receipts(session))

    async with running(hs, tools=["gate"]):
        await dispatch(bus, intent)
        await eventually(refused, timeout=10, message="stale complete refused")
        second = taken[0]
        winner = ToolResult(outcome="ok", output={"by": "hands-b"}, attempt=second.attempt)
        await store.runs.complete(session, intent, second.attempt, winner, OTHER_HANDS)
        await settled(bus, "gate")
    assert (await result_of(store, intent)) == winner
    refusal = next(r for r in await store.receipts(session) if r.kind == "refused")
    assert refusal.detail.current == 2 and refusal.worker and refusal.worker.name == "hands-t"


async def test_a_retried_complete_that_had_landed_counts_as_completed(settings: Settings) -> None:
    """A complete whose reply was lost is retried; finding it applied is success, not refusal."""
    worker = HandsWorker(settings, APP, ["echo"])
    intent = ToolIntent(run_id="r", session_id="s", task_id="t", tool="echo",
                        operation_id="op-r", wake_subject="x")
    result = ToolResult(outcome="ok", attempt=1)
    answers: list[BaseException] = []

    class LostReply:
        async def complete(self, *args: Any, **kwargs: Any) -> bool:
            raise answers.pop(0)

    worker.store = SimpleNamespace(runs=LostReply())  # type: ignore[assignment]
    answers[:] = [RedisUnavailable("reply lost"), StaleAttemptError("s", "r", 1, 1, "completed")]
    assert await worker._complete(intent, 1, result, delivery=1) is True
    answers[:] = [StaleAttemptError("s", "r", 1, 2, "running")]
    assert await worker._complete(intent, 1, result, delivery=1) is False


# ---------------------------------------------------------------- shutdown


async def test_shutdown_drains_an_in_flight_tool(
    hs: Settings, store: Store, bus: Bus
) -> None:
    async with MailboxServer(delay_ms=700) as slow_mail:
        settings = hs.model_copy(update={"mail_url": slow_mail.url})
        session = new_id("s")
        intent = make_intent(bus, session, "send_email",
                             {"to": "f@example.com", "subject": "Notice", "body": "Hello"})
        await commit_runs(store, bus, session, [intent])
        worker = HandsWorker(settings, APP, ["send_email"])
        serving = asyncio.create_task(worker.serve())
        await asyncio.wait_for(worker.ready.wait(), 10)
        await dispatch(bus, intent)
        await eventually(lambda: slow_mail.operations, message="mail accepted, reply held")
        assert worker.inflight == 1
        worker.shutdown()
        await asyncio.wait_for(serving, 15)
        run = await store.runs.get(session, intent.run_id)
        assert run and run.status == "completed" and run.result and run.result.ok
        assert slow_mail.raw_requests == 1
        await settled(bus, "send_email")
