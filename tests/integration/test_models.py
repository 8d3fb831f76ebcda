"""The HTTP model clients over real HTTP against tests.model_server, with Brain, Hands and
Relay in one event loop: the five-notice run through each adapter (streamed and JSON),
streamed text as partial receipts, retries (Retry-After, 5xx, a truncated or stalled stream)
as durable sleeps, and clear model errors (a malformed stream, a 4xx).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from baton.app import Agent, App
from baton.brain.worker import BrainWorker
from baton.cli.trace import build_trace, render_text
from baton.cli.trace_html import render_html
from baton.cli.watch import Watch, render_change
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.hands.tools import send_email
from baton.hands.worker import HandsWorker
from baton.models import Entry, Submission, Task
from baton.receipts import Receipt
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.state import Partial
from tests.helpers import eventually, running
from tests.model_apps import INSTRUCTIONS, anthropic_app, openai_app
from tests.model_server import Behaviour, ModelServer

FIVE = ("Send the approved notice to ada@example.com, grace@example.com, linus@example.com, "
        "margaret@example.com and barbara@example.com, then summarise.")
APPS = {"openai": openai_app, "anthropic": anthropic_app}


@pytest.fixture
async def model_server() -> AsyncIterator[ModelServer]:
    async with ModelServer() as server:
        yield server


@pytest.fixture
async def mailbox() -> AsyncIterator[MailboxServer]:
    async with MailboxServer() as server:
        yield server


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
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app)
    hands = HandsWorker(settings.model_copy(update={"worker_name": "hands-1"}), app)
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    async with running(relay, hands, brain):
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


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_five_notices_through_each_adapter(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer, wire: str,
    stream: bool,
) -> None:
    s = model_settings(settings, model_server, model_stream=stream)
    out = await run_notices(s, APPS[wire], mailbox)
    final = out.final
    assert final.status == "completed", final
    assert final.answer and final.answer.count(": sent") == 5, final.answer
    entries: list[Entry] = out.entries
    assert kinds(entries) == ["user", "model", *["tool_result"] * 5, "model"]
    calls = entries[1].tool_calls
    assert [c.arguments["to"] for c in calls] == [
        "ada@example.com", "grace@example.com", "linus@example.com", "margaret@example.com",
        "barbara@example.com"]
    assert {e.tool_call_id for e in entries[2:7]} == {c.id for c in calls}
    assert all(e.usage and e.usage.input_tokens > 0 and e.usage.output_tokens > 0
               for e in (entries[1], entries[-1]))
    stats = await mail_stats(mailbox)
    assert stats["accepted"] == 5 and stats["raw_requests"] == 5
    # One request per turn, ids derived from the task (turn 1 and 2, attempt 0), streamed or not.
    seen = model_server.requests
    assert [r.wire for r in seen] == [wire, wire]
    assert [r.request_id for r in seen] == [f"{final.task_id}:1:0", f"{final.task_id}:2:0"]
    assert all(bool(r.body.get("stream")) == stream for r in seen)
    # The second request is the conversation rebuilt from committed entries: five results
    # answering the five calls by id.
    body = seen[1].body
    if wire == "openai":
        results = [m for m in body["messages"] if m["role"] == "tool"]
        assert [m["tool_call_id"] for m in results] == [c.id for c in calls]
        assert body["messages"][0] == {"role": "system", "content": openai_app.agents[
            "notices"].instructions}
    else:
        blocks = [b for m in body["messages"] for b in m["content"] if b["type"] == "tool_result"]
        assert [b["tool_use_id"] for b in blocks] == [c.id for c in calls]
        assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    receipts: list[Receipt] = out.receipts
    tools = next(r for r in receipts if getattr(r.detail, "step", None) == "tools")
    assert tools.detail.request_id == f"{final.task_id}:1:0"
    assert tools.detail.usage == entries[1].usage


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_streamed_text_goes_out_as_partial_receipts(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer, wire: str
) -> None:
    model_server.script(Behaviour(), Behaviour(chunk_delay_s=0.03))  # the summary, slowly
    s = model_settings(settings, model_server, model_partial_interval_ms=50)
    out = await run_notices(s, APPS[wire], mailbox)
    final = out.final
    assert final.status == "completed" and final.answer
    partials = [r for r in out.receipts if r.kind == "partial"]
    assert len(partials) >= 3, partials
    streamed = "".join(r.detail.delta for r in partials)
    assert final.answer.startswith(streamed) and len(streamed) > len(final.answer) // 3
    assert all(r.detail.request_id == f"{final.task_id}:2:0" for r in partials)
    # Throttled: the Brain sends saves at least the interval apart, on its own clock (Redis's
    # receipt times also carry each save's trip there, which a loaded machine stretches).
    sent = [r.detail.stream_ms for r in partials]
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert min(gaps) >= 49, gaps  # whole milliseconds of a 50 ms interval
    # Never a response: the final commit holds the answer and cleared the partial.
    assert kinds(out.entries) == ["user", "model", *["tool_result"] * 5, "model"]
    assert out.partial is None
    # baton watch prints the streamed text as it came.
    seen: list[dict[str, Any]] = []
    await Watch(s, final.session_id, seen.append, after="0-0", until_settled=True,
                block_ms=200).run()
    lines = [render_change(e) for e in seen if e["type"] == "stream"]
    assert "".join(e["text"] for e in seen if e["type"] == "stream") == streamed
    assert lines and all(line.startswith("   ... ") for line in lines)


@pytest.mark.parametrize(("wire", "status"), [("openai", 429), ("anthropic", 429),
                                              ("openai", 503)])
async def test_retry_waits_as_told_then_the_next_attempt_succeeds(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer, wire: str,
    status: int,
) -> None:
    model_server.script(Behaviour(status=status, retry_after=1.5 if status == 429 else None))
    s = model_settings(settings, model_server)
    sleeping: dict[str, Any] = {}

    async def check(client: Client, sub: Submission) -> None:
        store = client.store

        async def retrying() -> Task | None:
            t = await store.inbox.task(sub.session_id, sub.task_id)
            return t if t.state.name == "sleeping" else None
        task = await eventually(retrying, timeout=10, message="task in its retry phase")
        receipts = await store.receipts(sub.session_id)
        receipt = next(r for r in receipts if getattr(r.detail, "step", None) == "retry")
        timers = await store.redis.zrange(store.keys.timers(store.keys.shard_of(sub.session_id)),
                                          0, -1, withscores=True)
        sleeping.update(task=task, receipt=receipt, timers=dict(timers))  # type: ignore[arg-type]

    out = await run_notices(s, APPS[wire], mailbox, check=check)
    final = out.final
    assert final.status == "completed", final
    task, receipt = sleeping["task"], sleeping["receipt"]
    wait_ms = 1500 if status == 429 else s.model_backoff_ms
    # The durable timer: due at the failure's time plus Retry-After (or the first backoff).
    assert task.checkpoint.phase == "retry"
    assert abs(task.state.until_ms - (receipt.ts_ms + wait_ms)) < 250, (task, receipt.ts_ms)
    member = f"task|{final.session_id}|{final.task_id}|"
    assert [due for m, due in sleeping["timers"].items() if m.startswith(member)] == \
        [task.state.until_ms]
    data = task.checkpoint.data
    assert data["failures"] == 1 and data["deadline_ms"] > task.state.until_ms
    assert data["attempts"][0]["status"] == status
    assert data["attempts"][0]["request_id"] == f"{final.task_id}:1:0"
    assert receipt.detail.retry_in_ms == wait_ms and receipt.detail.status == status
    # baton trace shows each attempt: status, error, wait and usage (text and HTML views).
    trace = build_trace(final.session_id, out.receipts)
    attempts = trace.model_attempts
    assert [(a.request_id, a.status, a.outcome, a.wait_ms) for a in attempts] == [
        (f"{final.task_id}:1:0", str(status), "retry", wait_ms),
        (f"{final.task_id}:1:1", "ok", "tool calls", None),
        (f"{final.task_id}:2:0", "ok", "answered", None)]
    assert f"scripted {status}" in attempts[0].error
    assert attempts[1].input_tokens > 0 and attempts[2].output_tokens > 0
    text = render_text(trace)
    assert f"{final.task_id}:1:0 {status} retry: " in text
    assert f"retry in {wait_ms} ms" in text and f"{attempts[1].input_tokens} in" in text
    html = render_html(trace)
    assert "<h2>Model attempts</h2>" in html and f"<td>{wait_ms} ms</td>" in html
    assert trace.to_json()["model_attempts"][0]["status"] == str(status)
    seen = model_server.requests
    assert [r.request_id for r in seen] == [f"{final.task_id}:1:0", f"{final.task_id}:1:1",
                                            f"{final.task_id}:2:0"]
    stats = await mail_stats(mailbox)
    assert stats["accepted"] == 5 and stats["raw_requests"] == 5


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_truncated_stream_is_retried_and_its_text_kept_as_interrupted(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer, wire: str
) -> None:
    preamble = "I will send the notice to each of the five recipients now. "
    model_server.script(Behaviour(truncate=True, preamble=preamble))
    out = await run_notices(model_settings(settings, model_server), APPS[wire], mailbox)
    final = out.final
    assert final.status == "completed", final
    entries: list[Entry] = out.entries
    assert kinds(entries) == ["user", "interrupted", "model", *["tool_result"] * 5, "model"]
    assert entries[1].text and preamble.startswith(entries[1].text)
    retry = out.step("retry")
    assert "truncated" in retry.detail.error
    # The re-issued request shows the cut-off text as interrupted, not as an answer.
    again = model_server.requests[1]
    assert again.request_id == f"{final.task_id}:1:1"
    if wire == "openai":
        msgs = again.body["messages"]
        assert msgs[2]["role"] == "assistant" and msgs[2]["content"] == entries[1].text
        assert msgs[3]["role"] == "user" and "interrupted" in msgs[3]["content"]
        assert "tool_calls" not in msgs[2]
    else:
        msgs = again.body["messages"]
        assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
        assert msgs[1]["content"] == [{"type": "text", "text": entries[1].text}]
        assert "interrupted" in msgs[2]["content"][0]["text"]


async def test_stalled_stream_times_out_and_is_retried(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer
) -> None:
    model_server.script(Behaviour(stall=True))
    s = model_settings(settings, model_server, model_read_timeout_s=0.5)
    started = time.monotonic()
    out = await run_notices(s, openai_app, mailbox)
    final = out.final
    assert final.status == "completed", final
    assert time.monotonic() - started < 15
    retry = out.step("retry")
    assert "read timeout" in retry.detail.error


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_cancel_stops_a_model_call_in_progress(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer, wire: str
) -> None:
    """The model holds its answer (a stream that stalls; the read timeout is minutes away):
    a cancel stops the call at the Brain's next lease renewal and the session ends
    cancelled. It waited for the call to end first (up to the read timeout, then the call
    was retried before the cancel was seen)."""
    model_server.script(Behaviour(stall=True))
    s = model_settings(settings, model_server, model_read_timeout_s=600.0, lease_ms=900)

    async def cancel_mid_call(client: Client, sub: Submission) -> None:
        await eventually(lambda: model_server.requests, timeout=30,
                         message="the model asked")
        assert (await client.cancel(sub.session_id)).status == "requested"

    out = await run_notices(s, APPS[wire], mailbox, check=cancel_mid_call)
    assert out.final.status == "cancelled", out.final
    assert out.task.state.name == "terminal" and out.task.state.outcome == "cancelled"
    assert len(model_server.requests) == 1  # stopped, not retried
    assert [r.kind for r in out.receipts].count("cancel") == 1


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_malformed_stream_fails_with_a_clear_model_error(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer, wire: str
) -> None:
    model_server.script(Behaviour(malformed=True))
    out = await run_notices(model_settings(settings, model_server), APPS[wire], mailbox)
    final = out.final
    assert final.status == "failed"
    assert final.error and final.error.startswith("model_error: ")
    assert "malformed answer: invalid JSON" in final.error, final.error
    assert len(model_server.requests) == 1  # not retried: the same request would fail again
    task: Task = out.task
    assert task.state.name == "terminal" and task.state.outcome == "failed"


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_client_error_is_not_retried(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer, wire: str
) -> None:
    model_server.script(Behaviour(status=400))
    out = await run_notices(model_settings(settings, model_server), APPS[wire], mailbox)
    final = out.final
    assert final.status == "failed" and final.error
    provider = {"openai": "openai-compatible", "anthropic": "anthropic"}[wire]
    assert final.error == f"model_error: {provider} answered 400: invalid_request_error: " \
        "scripted 400"
    assert len(model_server.requests) == 1


async def test_retries_give_up_at_the_deadline(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer
) -> None:
    model_server.script(*[Behaviour(status=500)] * 10)
    s = model_settings(settings, model_server, model_backoff_ms=100, model_retry_deadline_s=0.5)
    out = await run_notices(s, openai_app, mailbox)
    final = out.final
    assert final.status == "failed" and final.error
    # Backoff 100, 200 ms, then 400 ms would pass the 500 ms deadline: at most three attempts
    # fit, fewer when a loaded machine slows each one; the Brain says how many it made.
    attempts = [r.request_id.rsplit(":", 1)[1] for r in model_server.requests]
    assert 1 <= len(attempts) <= 3 and attempts == [str(i) for i in range(len(attempts))]
    assert final.error.startswith(f"model_error: gave up after {len(attempts)} failed attempt"), \
        final.error
    final_receipt = out.receipts[-1]
    assert final_receipt.detail.outcome == "failed" and final_receipt.detail.status == 500


FOLLOW_UP = "How many of those notices went out?"


def order_of(seen: Any) -> list[str]:
    """The request's conversation as role/kind tags, whatever the wire format."""
    out: list[str] = []
    if seen.wire == "openai":
        for m in seen.body["messages"]:
            if m["role"] == "user":
                out.append("follow-up" if m["content"] == FOLLOW_UP else "user")
            elif m["role"] == "tool":
                out.append("pending" if '"no_result"' in m["content"] else "result")
            elif m["role"] == "assistant":
                out.append("calls" if m.get("tool_calls") else "answer")
        return out
    for m in seen.body["messages"]:
        for b in m["content"]:
            if b["type"] == "tool_result":
                out.append("pending" if '"no_result"' in b["content"] else "result")
            elif b["type"] == "tool_use":
                if not out or out[-1] != "calls":
                    out.append("calls")
            elif m["role"] == "user":
                out.append("follow-up" if b["text"] == FOLLOW_UP else "user")
            else:
                out.append("answer")
    return out


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_follow_up_while_tools_run_is_placed_after_their_results(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer, wire: str,
    stream: bool,
) -> None:
    """A message submitted while the turn's tools run is committed between the calls and
    their results. The running task's requests leave it out (it is answered by its own
    task); the later tasks' requests show the first exchange whole, results right after
    their calls (the server refuses otherwise, as the providers do), then the message."""
    s = model_settings(settings, model_server, model_stream=stream, mail_url=mailbox.url)
    app = APPS[wire]
    brain = BrainWorker(s.model_copy(update={"worker_name": "brain-1"}), app)
    hands = HandsWorker(s.model_copy(update={"worker_name": "hands-1"}), app)
    relay = Relay(s.model_copy(update={"worker_name": "relay-1"}))
    async with httpx.AsyncClient() as http:
        await http.post(f"{mailbox.url}/hold")  # the five sends wait: the tools are running
        async with running(relay, hands, brain):
            client = await Client.connect(s)
            try:
                first, _ = await client.submit(FIVE, agent="notices")
                sid = first.session_id

                async def held() -> bool:
                    return (await mail_stats(mailbox))["held"] == 5
                await eventually(held, timeout=20, message="five sends held")
                second, _ = await client.submit(FOLLOW_UP, agent="notices", session_id=sid)
                await http.post(f"{mailbox.url}/release")
                done = [await client.wait(sub, timeout=30) for sub in (first, second)]
                third, _ = await client.submit("Thanks.", agent="notices", session_id=sid)
                done.append(await client.wait(third, timeout=30))
                entries = await client.store.entries(sid)
            finally:
                await client.close()
    assert [d.status for d in done] == ["completed"] * 3, done
    # Committed in arrival order: the follow-up sits between the calls and their results.
    tags = kinds(entries)
    assert tags.index("user", 1) < tags.index("tool_result"), tags
    seen = model_server.requests
    assert all(r.behaviour.status == 200 for r in seen)
    # The first task's next turn: results right after the calls, and no follow-up; the
    # follow-up's own task runs once the first has ended and sees its exchange whole, then
    # the message; the third sees the same, then the follow-up's answer and its own message.
    exchange = ["user", "calls", *["result"] * 5]
    later = seen[1:]
    assert [r.request_id for r in later] == [f"{first.task_id}:2:0", f"{second.task_id}:1:0",
                                             f"{third.task_id}:1:0"]
    assert [order_of(r) for r in later] == [
        exchange, [*exchange, "answer", "follow-up"],
        [*exchange, "answer", "follow-up", "answer", "user"]]
    stats = await mail_stats(mailbox)
    assert stats["accepted"] == 5


async def test_openai_stream_without_done_is_truncated_and_retried(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer
) -> None:
    """finish_reason, then the end of the stream: no usage chunk, no [DONE]."""
    model_server.script(Behaviour(no_done=True))
    out = await run_notices(model_settings(settings, model_server), openai_app, mailbox)
    assert out.final.status == "completed", out.final
    retry = out.step("retry")
    assert "truncated" in retry.detail.error and "[DONE]" in retry.detail.error
    seen = model_server.requests
    assert [r.request_id for r in seen] == [f"{out.final.task_id}:1:0",
                                            f"{out.final.task_id}:1:1",
                                            f"{out.final.task_id}:2:0"]
    # The request that got a complete answer has its usage (not the cut stream's 0/0).
    assert out.entries[1].usage and out.entries[1].usage.input_tokens > 0


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_idempotency_key_is_stable_across_attempts_of_one_request(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer, wire: str
) -> None:
    model_server.script(Behaviour(status=503), Behaviour(status=429, retry_after=0.2))
    out = await run_notices(model_settings(settings, model_server), APPS[wire], mailbox)
    assert out.final.status == "completed", out.final
    tid = out.final.task_id
    seen = model_server.requests
    assert [r.request_id for r in seen] == [f"{tid}:1:0", f"{tid}:1:1", f"{tid}:1:2",
                                            f"{tid}:2:0"]
    keys = [r.idempotency_key for r in seen]
    # One key for the three attempts that sent the same body; the next turn is another request.
    assert keys[0] == keys[1] == keys[2] and keys[0].startswith(f"{tid}:1:")
    assert keys[3].startswith(f"{tid}:2:") and keys[3] != keys[0]


async def test_a_changed_body_gets_a_new_idempotency_key(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer
) -> None:
    """A retry whose request now shows an interrupted answer is another request."""
    model_server.script(Behaviour(truncate=True, preamble="I will send them all now. "))
    out = await run_notices(model_settings(settings, model_server), openai_app, mailbox)
    assert out.final.status == "completed", out.final
    first, again = model_server.requests[:2]
    assert first.body != again.body
    assert first.idempotency_key != again.idempotency_key


@pytest.mark.parametrize(("model", "field"), [
    ("openai:gpt-5-mini", "max_completion_tokens"), ("openai:o4-mini", "max_completion_tokens"),
    ("openai:gpt-4o-mini", "max_tokens"), ("openai-compatible:llama3.1", "max_tokens"),
])
async def test_token_limit_field_by_model(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer, model: str,
    field: str,
) -> None:
    """The server refuses max_tokens for o-series and gpt-5 models, as OpenAI does."""
    app = App(agents=[Agent(name="notices", compat=1, model=model, tools=("send_email",),
                            instructions=INSTRUCTIONS)], tools=[send_email])
    out = await run_notices(model_settings(settings, model_server, model_max_tokens=321), app,
                            mailbox)
    assert out.final.status == "completed", out.final
    assert all(r.body.get(field) == 321 for r in model_server.requests)
    other = {"max_tokens", "max_completion_tokens"} - {field}
    assert not any(other & r.body.keys() for r in model_server.requests)
