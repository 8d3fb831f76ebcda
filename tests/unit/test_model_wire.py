"""Model plumbing without a server: choosing a client, mapping entries to each wire format,
reading Retry-After, backoff and deadline, provider keys from the environment."""

from __future__ import annotations

import httpx
import pytest

from baton.brain import anthropic_messages, openai_chat
from baton.brain.model import (
    INTERRUPTED_NOTE,
    PENDING_NOTE,
    ModelRequest,
    conversation,
    model_client,
    streams,
    visible_to,
)
from baton.brain.model_http import idempotency_key, retry_after, status_error, transport_error
from baton.brain.retry import backoff_ms, retry_at
from baton.brain.scripted import ScriptedModel
from baton.errors import ConfigError, ModelError, ModelRetryableError
from baton.models import Entry, ToolCall
from baton.settings import Settings

CALL = ToolCall(id="call_1", name="send_email", arguments={"to": "ada@example.com"})
ENTRIES = (
    Entry(kind="user", text="notify ada@example.com"),
    Entry(kind="interrupted", text="I will send"),
    Entry(kind="model", text="Sending.", tool_calls=(CALL,)),
    Entry(kind="tool_result", text='{"outcome": "ok"}', tool_call_id="call_1", is_error=False),
)
REQUEST = ModelRequest(model="m", instructions="Be brief.", entries=ENTRIES, request_id="t:1:0",
                       tools=({"name": "send_email", "description": "Send.",
                               "parameters": {"type": "object"}},))


def test_openai_messages_rebuild_the_conversation() -> None:
    assert openai_chat.messages(REQUEST) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "notify ada@example.com"},
        {"role": "assistant", "content": "I will send"},
        {"role": "user", "content": INTERRUPTED_NOTE},
        {"role": "assistant", "content": "Sending.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "send_email", "arguments": '{"to":"ada@example.com"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"outcome": "ok"}'},
    ]
    assert openai_chat.tools(REQUEST) == [{"type": "function", "function": {
        "name": "send_email", "description": "Send.", "parameters": {"type": "object"}}}]


def test_anthropic_messages_alternate_and_merge_blocks() -> None:
    assert anthropic_messages.messages(REQUEST) == [
        {"role": "user", "content": [{"type": "text", "text": "notify ada@example.com"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "I will send"}]},
        {"role": "user", "content": [{"type": "text", "text": INTERRUPTED_NOTE}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Sending."},
            {"type": "tool_use", "id": "call_1", "name": "send_email",
             "input": {"to": "ada@example.com"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                      "content": '{"outcome": "ok"}', "is_error": False}]},
    ]
    assert anthropic_messages.tools(REQUEST) == [
        {"name": "send_email", "description": "Send.", "input_schema": {"type": "object"}}]


def test_model_names_pick_a_provider_and_keys_come_from_settings() -> None:
    assert isinstance(model_client("scripted"), ScriptedModel)
    s = Settings(openai_base_url="http://localhost:11434/v1", anthropic_api_key="k")
    local = model_client("openai-compatible:llama3", s)
    assert isinstance(local, openai_chat.OpenAIClient) and local.model == "llama3"
    assert local.base_url == "http://localhost:11434/v1" and streams(local)
    assert isinstance(model_client("anthropic:claude-x", s), anthropic_messages.AnthropicClient)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        model_client("openai:gpt-4o-mini", Settings())
    with pytest.raises(ConfigError, match="BATON_OPENAI_BASE_URL"):
        model_client("openai-compatible:llama3", Settings())
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        model_client("anthropic:claude-x", Settings())
    with pytest.raises(ConfigError, match="unknown model"):
        model_client("gemini:pro", s)
    assert not streams(ScriptedModel())


def test_provider_keys_from_their_usual_variables_or_baton_ones() -> None:
    s = Settings.from_env({"OPENAI_API_KEY": "sk-one", "ANTHROPIC_API_KEY": "sk-two",
                           "BATON_ANTHROPIC_API_KEY": "sk-three"})
    assert (s.openai_api_key, s.anthropic_api_key) == ("sk-one", "sk-three")
    assert "sk-" not in repr(s)


def test_retry_after_in_seconds_milliseconds_or_a_date() -> None:
    assert retry_after(httpx.Headers({"retry-after": "2"})) == 2.0
    assert retry_after(httpx.Headers({"retry-after-ms": "250", "retry-after": "9"})) == 0.25
    late = retry_after(httpx.Headers({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}))
    assert late == 0.0  # a date in the past: no wait
    assert retry_after(httpx.Headers({})) is None


def test_statuses_split_into_retryable_and_terminal() -> None:
    def error(status: int, body: bytes = b"{}") -> ModelError:
        return status_error("openai", httpx.Response(status, headers={"retry-after": "3"}), body)
    for status in (408, 429, 500, 502, 503, 529):
        assert isinstance(error(status), ModelRetryableError), status
    assert error(429).retry_after_s == 3.0  # type: ignore[attr-defined]
    bad = error(401, b'{"error": {"type": "invalid_api_key", "message": "Bad key"}}')
    assert not isinstance(bad, ModelRetryableError) and not bad.retryable
    assert str(bad) == "openai answered 401: invalid_api_key: Bad key"


def test_backoff_doubles_to_its_cap_and_stops_at_the_deadline() -> None:
    s = Settings(model_backoff_ms=500, model_backoff_max_ms=3000)
    assert [backoff_ms(s, n) for n in range(1, 6)] == [500, 1000, 2000, 3000, 3000]
    assert retry_at(s, 1000, 1, deadline_ms=10_000) == 1500
    assert retry_at(s, 1000, 1, deadline_ms=10_000, retry_after_s=4.0) == 5000
    assert retry_at(s, 9000, 3, deadline_ms=10_000) is None


def test_conversation_answers_each_call_before_what_arrived_meanwhile() -> None:
    """Entries in commit order: a follow-up between the calls and their results."""
    two = ToolCall(id="call_2", name="send_email", arguments={"to": "grace@example.com"})
    entries = (
        Entry(kind="user", text="notify ada and grace"),
        Entry(kind="model", text="", tool_calls=(CALL, two)),
        Entry(kind="tool_result", text="r1", tool_call_id="call_1"),
        Entry(kind="user", text="how many went out?"),
        Entry(kind="tool_result", text="r2", tool_call_id="call_2"),
    )
    ordered = conversation(entries)
    assert [(e.kind, e.text) for e in ordered] == [
        ("user", "notify ada and grace"), ("model", ""), ("tool_result", "r1"),
        ("tool_result", "r2"), ("user", "how many went out?")]
    assert conversation(ordered) == ordered  # a view: applying it again changes nothing
    # A call without a result entry (still running, or cancelled before it ran).
    pending = conversation(entries[:4])
    assert [(e.kind, e.text) for e in pending] == [
        ("user", "notify ada and grace"), ("model", ""), ("tool_result", "r1"),
        ("tool_result", PENDING_NOTE), ("user", "how many went out?")]
    request = REQUEST.model_copy(update={"entries": entries})
    roles = [m["role"] for m in openai_chat.messages(request)]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user"]
    turns = anthropic_messages.messages(request)
    assert [m["role"] for m in turns] == ["user", "assistant", "user"]
    assert [b["type"] for b in turns[2]["content"]] == ["tool_result", "tool_result", "text"]


def test_a_task_sees_the_tasks_before_it_whole_and_none_begun_after_it() -> None:
    """Commit order: B's message arrives while A's tools run, C's during A's answer."""
    def e(kind: str, text: str, task: str | None, **kw: object) -> Entry:
        return Entry(kind=kind, text=text, task_id=task, **kw)  # type: ignore[arg-type]

    entries = (
        e("user", "send to g1", "A"),
        e("model", "", "A", tool_calls=(CALL,)),
        e("user", "send to g2", "B"),
        e("tool_result", "r1", "A", tool_call_id="call_1"),
        e("system", "note", None),  # of no task: stays with the entry before it (A's)
        e("user", "and g3", "C"),
        e("model", "sent to g1", "A"),
        e("model", "sending g2", "B"),
    )
    texts = lambda got: [x.text for x in got]  # noqa: E731
    # A (running): its own entries only; B's and C's messages wait for their own tasks.
    assert texts(visible_to(entries, "A")) == ["send to g1", "", "r1", "note", "sent to g1"]
    # B: A's exchange whole, then its own message and what it did.
    assert texts(visible_to(entries, "B")) == [
        "send to g1", "", "r1", "note", "sent to g1", "send to g2", "sending g2"]
    assert texts(visible_to(entries, "C")) == [
        "send to g1", "", "r1", "note", "sent to g1", "send to g2", "sending g2", "and g3"]
    assert visible_to(entries, "D") == entries  # no entry of its own: every entry, as is
    # The scripted model answers the last message it is shown: A's own, not B's.
    assert texts(conversation(visible_to(entries[:4], "A")))[-1] == "r1"


@pytest.mark.parametrize(("model", "compatible", "setting", "field"), [
    ("gpt-5", False, "auto", "max_completion_tokens"),
    ("o3-mini", False, "auto", "max_completion_tokens"),
    ("gpt-4.1", False, "auto", "max_completion_tokens"),
    ("gpt-4o-mini", False, "auto", "max_completion_tokens"),
    ("gpt-5", True, "auto", "max_tokens"),
    ("llama3.1", True, "max_completion_tokens", "max_completion_tokens"),
    ("gpt-5", False, "max_tokens", "max_tokens"),
])
def test_openai_token_limit_field(model: str, compatible: bool, setting: str,
                                  field: str) -> None:
    s = Settings(openai_base_url="http://x/v1", openai_api_key="k",
                 openai_max_tokens_field=setting, model_max_tokens=99)
    client = openai_chat.OpenAIClient(model, s, compatible=compatible)
    body = client.body(REQUEST, stream=False)
    assert body[field] == 99
    assert not ({"max_tokens", "max_completion_tokens"} - {field}) & body.keys()


def test_idempotency_key_follows_the_body_not_the_attempt() -> None:
    first = REQUEST.model_copy(update={"request_id": "t:1:0", "logical_id": "t:1"})
    again = REQUEST.model_copy(update={"request_id": "t:1:1", "logical_id": "t:1"})
    assert idempotency_key(first, b"{}") == idempotency_key(again, b"{}")
    assert idempotency_key(first, b"{}").startswith("t:1:")
    assert idempotency_key(first, b"{}") != idempotency_key(again, b'{"x":1}')


def test_a_transport_error_without_text_ends_its_sentence() -> None:
    """httpx's timeouts often carry no text: the message was 'no data within the read
    timeout: ' with nothing after the colon."""
    assert str(transport_error("openai-compatible", httpx.ReadTimeout(""))) == (
        "openai-compatible: no data within the read timeout")
    assert str(transport_error("anthropic", httpx.ConnectError("refused"))) == (
        "anthropic: cannot connect: refused")
