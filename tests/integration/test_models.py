"""The HTTP model clients over real HTTP against tests.model_server, with Brain, Hands and
Relay in one event loop: the five-notice run through each adapter (streamed and JSON),
streamed text as partial receipts, a follow-up while tools run, the Idempotency-Key and the
token limit field. Failures and retries: test_model_failures.py.
"""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import pytest

from baton.app import Agent, App
from baton.brain.worker import BrainWorker
from baton.cli.watch import Watch, render_change
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.hands.tools import send_email
from baton.hands.worker import HandsWorker
from baton.models import Entry
from baton.receipts import Receipt
from baton.relay.worker import Relay
from baton.settings import Settings
from tests.helpers import eventually, running
from tests.integration.model_runs import APPS, FIVE, kinds, mail_stats, model_settings, run_notices
from tests.model_apps import INSTRUCTIONS, openai_app
from tests.model_server import Behaviour, ModelServer


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
    ("openai:gpt-4o-mini", "max_completion_tokens"),
    ("openai-compatible:llama3.1", "max_tokens"),
])
async def test_token_limit_field_by_model(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer, model: str,
    field: str,
) -> None:
    """The server refuses max_tokens for OpenAI's models (gpt-*, o-series), which OpenAI
    deprecates for every chat model and its reasoning models refuse; a compatible
    server's model gets max_tokens."""
    app = App(agents=[Agent(name="notices", compat=1, model=model, tools=("send_email",),
                            instructions=INSTRUCTIONS)], tools=[send_email])
    out = await run_notices(model_settings(settings, model_server, model_max_tokens=321), app,
                            mailbox)
    assert out.final.status == "completed", out.final
    assert all(r.body.get(field) == 321 for r in model_server.requests)
    other = {"max_tokens", "max_completion_tokens"} - {field}
    assert not any(other & r.body.keys() for r in model_server.requests)
