"""The HTTP model clients' failures over real HTTP against tests.model_server, with Brain,
Hands and Relay in one event loop: retries (Retry-After, 5xx, a truncated or stalled stream)
as durable sleeps, a cancel during a model call, and clear model errors (a malformed stream,
a 4xx, retries past their deadline).
"""

from __future__ import annotations

from typing import Any

import pytest

from baton.cli.trace import build_trace, render_text
from baton.cli.trace.html import render_html
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.models import Entry, Submission, Task
from baton.settings import Settings
from tests.helpers import eventually
from tests.integration.model_runs import APPS, kinds, mail_stats, model_settings, run_notices
from tests.model_apps import openai_app
from tests.model_server import Behaviour, ModelServer


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
    out = await run_notices(s, openai_app, mailbox)
    final = out.final
    assert final.status == "completed", final
    retry = out.step("retry")
    assert "read timeout" in retry.detail.error
    # The stalled attempt was given up for the next one of the same turn (not waited out).
    ids = [r.request_id for r in model_server.requests]
    assert ids[:2] == [f"{final.task_id}:1:0", f"{final.task_id}:1:1"], ids


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
