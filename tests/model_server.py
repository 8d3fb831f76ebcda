"""A local model server for the tests: OpenAI Chat Completions and Anthropic Messages.

It speaks both wire formats as the providers do (JSON answers and SSE streams, tool calls,
usage, error bodies with ``Retry-After``) and answers like the scripted notices model:
one ``send_email`` call per address in the user's message, all in one answer; once the
results are in, a summary naming each recipient's outcome. A test scripts how the next
requests go wrong (:class:`Behaviour`) and reads what the server saw (:attr:`requests`)::

    async with ModelServer() as server:
        server.script(Behaviour(status=429, retry_after=1.0))
        ...  # base URLs: server.openai_url, server.anthropic_url

    POST /v1/chat/completions   OpenAI (``Authorization: Bearer <key>`` if a key is set)
    POST /v1/messages           Anthropic (``x-api-key``, ``anthropic-version``)
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from baton.brain.model import INTERRUPTED_NOTE

EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")


@dataclass(frozen=True)
class Behaviour:
    """How the server answers one request (the default: well, at once)."""

    status: int = 200  # an error status answers with the provider's error body
    retry_after: float | None = None  # Retry-After header (seconds) with an error status
    preamble: str = ""  # text streamed before the tool calls
    chunk_delay_s: float = 0.0  # the slow stream: a pause before each streamed event
    truncate: bool = False  # the stream stops (cleanly) before its end event
    malformed: bool = False  # the stream carries an event that is not JSON
    stall: bool = False  # headers, then nothing (until the client gives up)
    no_done: bool = False  # OpenAI: the stream ends after finish_reason (no usage, no [DONE])


@dataclass
class Seen:
    """One request as the server received it."""

    wire: str  # "openai" | "anthropic"
    headers: dict[str, str]
    body: dict[str, Any]
    behaviour: Behaviour
    at: float = 0.0  # when it arrived (time.time(), the server's clock)
    refused_at: float | None = None  # when an error status was sent for it

    @property
    def request_id(self) -> str:
        """The attempt's id (``X-Client-Request-Id``)."""
        return self.headers.get("x-client-request-id", "")

    @property
    def idempotency_key(self) -> str:
        return self.headers.get("idempotency-key", "")


@dataclass
class Turn:
    """The conversation as the scripted model reads it, whatever the wire format."""

    user: str | None = None
    calls: dict[str, str] = field(default_factory=dict)  # tool call id -> recipient
    results: list[tuple[str, str]] = field(default_factory=list)  # (call id, result text)
    interrupted: list[str] = field(default_factory=list)  # texts shown as interrupted
    tools: set[str] = field(default_factory=set)


class ModelServer:
    """The server; ``async with`` starts it on a free port and stops it."""

    def __init__(self, host: str = "127.0.0.1", key: str = "test-key") -> None:
        self.host = host
        self.key = key
        self.port = 0
        self.requests: list[Seen] = []
        self._script: deque[Behaviour] = deque()
        self._runner: web.AppRunner | None = None
        self.seen = asyncio.Event()  # set on each request (tests clear it)
        self.in_flight = 0  # requests arrived and not answered in full yet
        self.max_in_flight = 0
        # hold(): each request is recorded and waits for release() before it is answered
        # (and before its behaviour is taken), so a test stops the fleet at a known point
        self._open = asyncio.Event()
        self._open.set()
        self.waiting = 0  # requests held

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def openai_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def anthropic_url(self) -> str:
        return self.url

    def hold(self) -> None:
        """Hold every request arriving from now on until :meth:`release`."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def script(self, *behaviours: Behaviour) -> None:
        """The next requests go like this, one behaviour each, in order."""
        self._script.extend(behaviours)

    async def __aenter__(self) -> ModelServer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._counted(self._openai))
        app.router.add_post("/v1/messages", self._counted(self._anthropic))
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # ------------------------------------------------------------------ requests

    def _counted(self, handler: Any) -> Any:
        """``handler``, counting the requests in flight until each is answered in full."""
        async def counted(request: web.Request) -> web.StreamResponse:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                return await handler(request)  # type: ignore[no-any-return]
            finally:
                self.in_flight -= 1
        return counted

    async def _receive(self, request: web.Request, wire: str) -> tuple[Seen, web.Response | None]:
        at = time.time()
        body = await request.json()
        if not self._open.is_set():
            self.waiting += 1
            try:
                await self._open.wait()
            finally:
                self.waiting -= 1
        behaviour = self._script.popleft() if self._script else Behaviour()
        seen = Seen(wire, {k.lower(): v for k, v in request.headers.items()}, body, behaviour,
                    at=at)
        self.requests.append(seen)
        self.seen.set()
        if wire == "openai" and request.headers.get("authorization") != f"Bearer {self.key}":
            return seen, _openai_error(401, "invalid_api_key", "Incorrect API key provided")
        # Anthropic: x-api-key, or a bearer token as the anthropic SDK sends its key since 2.x
        if wire == "anthropic" and (self.key not in (request.headers.get("x-api-key"),
                                                     _bearer(request.headers.get("authorization")))
                                    or not request.headers.get("anthropic-version")):
            return seen, _anthropic_error(401, "authentication_error", "invalid x-api-key")
        if wire == "openai" and (why := openai_invalid(body)):
            return seen, _openai_error(400, "invalid_request_error", why)
        if wire == "anthropic" and (why := anthropic_invalid(body)):
            return seen, _anthropic_error(400, "invalid_request_error", why)
        if behaviour.status != 200:
            seen.refused_at = time.time()
            headers = {}
            if behaviour.retry_after is not None:
                headers["Retry-After"] = f"{behaviour.retry_after:g}"
            make = _openai_error if wire == "openai" else _anthropic_error
            kind = {429: "rate_limit_error", 400: "invalid_request_error"}.get(
                behaviour.status, "api_error")
            return seen, make(behaviour.status, kind, f"scripted {behaviour.status}", headers)
        return seen, None

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        seen, refused = await self._receive(request, "openai")
        if refused is not None:
            return refused
        text, calls = answer(openai_turn(seen.body), seen.behaviour)
        usage = {"prompt_tokens": len(json.dumps(seen.body)) // 4,
                 "completion_tokens": len(text) // 4 + 10 * len(calls)}
        if not seen.body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = [
                    {"id": f"call_{i}", "type": "function",
                     "function": {"name": name, "arguments": json.dumps(args)}}
                    for i, (name, args) in enumerate(calls)]
            return web.json_response(
                {"id": "chatcmpl-test", "object": "chat.completion", "model": seen.body["model"],
                 "choices": [{"index": 0, "message": message,
                              "finish_reason": "tool_calls" if calls else "stop"}],
                 "usage": usage}, headers={"x-request-id": "req_test"})
        events: list[str] = []

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            return json.dumps({"id": "chatcmpl-test", "object": "chat.completion.chunk",
                               "choices": [{"index": 0, "delta": delta,
                                            "finish_reason": finish}]})

        events.append(chunk({"role": "assistant", "content": ""}))
        events += [chunk({"content": w}) for w in _words(text)]
        for i, (name, args) in enumerate(calls):
            raw = json.dumps(args)
            events.append(chunk({"tool_calls": [{"index": i, "id": f"call_{i}", "type": "function",
                                                 "function": {"name": name, "arguments": ""}}]}))
            half = len(raw) // 2  # arguments arrive in fragments
            for part in (raw[:half], raw[half:]):
                events.append(chunk({"tool_calls": [{"index": i,
                                                     "function": {"arguments": part}}]}))
        events.append(chunk({}, "tool_calls" if calls else "stop"))
        if seen.behaviour.no_done:
            return await self._stream(request, seen.behaviour, [("", e) for e in events])
        events.append(json.dumps({"id": "chatcmpl-test", "object": "chat.completion.chunk",
                                  "choices": [], "usage": usage}))
        events.append("[DONE]")
        return await self._stream(request, seen.behaviour, [("", e) for e in events])

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        seen, refused = await self._receive(request, "anthropic")
        if refused is not None:
            return refused
        text, calls = answer(anthropic_turn(seen.body), seen.behaviour)
        usage = {"input_tokens": len(json.dumps(seen.body)) // 4,
                 "output_tokens": len(text) // 4 + 10 * len(calls)}
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        content += [{"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": args}
                    for i, (name, args) in enumerate(calls)]
        stop = "tool_use" if calls else "end_turn"
        message = {"id": "msg_test", "type": "message", "role": "assistant",
                   "model": seen.body["model"], "content": content, "stop_reason": stop,
                   "usage": usage}
        if not seen.body.get("stream"):
            return web.json_response(message, headers={"request-id": "req_test"})
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": {
                **message, "content": [], "stop_reason": None,
                "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 1}}}),
            ("ping", {"type": "ping"}),
        ]
        for i, block in enumerate(content):
            if block["type"] == "text":
                events.append(("content_block_start", {"type": "content_block_start", "index": i,
                               "content_block": {"type": "text", "text": ""}}))
                events += [("content_block_delta", {"type": "content_block_delta", "index": i,
                            "delta": {"type": "text_delta", "text": w}}) for w in _words(text)]
            else:
                events.append(("content_block_start", {"type": "content_block_start", "index": i,
                               "content_block": {**block, "input": {}}}))
                raw = json.dumps(block["input"])
                half = len(raw) // 2
                events += [("content_block_delta", {"type": "content_block_delta", "index": i,
                            "delta": {"type": "input_json_delta", "partial_json": part}})
                           for part in (raw[:half], raw[half:])]
            events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        events.append(("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": stop},
                                         "usage": {"output_tokens": usage["output_tokens"]}}))
        events.append(("message_stop", {"type": "message_stop"}))
        return await self._stream(request, seen.behaviour,
                                  [(name, json.dumps(data)) for name, data in events])

    async def _stream(
        self, request: web.Request, b: Behaviour, events: list[tuple[str, str]]
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream",
                                           "cache-control": "no-cache",
                                           "x-request-id": "req_test"})
        await resp.prepare(request)
        if b.stall:
            await asyncio.sleep(3600)  # until the client gives up and the server shuts down
        if b.truncate:
            events = events[: max(2, len(events) // 2)]
        if b.malformed:
            events = [*events[:2], (events[2][0], '{"choices": [{"delta": {"content": "x"'),
                      *events[3:]]
        try:
            for name, data in events:
                if b.chunk_delay_s:
                    await asyncio.sleep(b.chunk_delay_s)
                head = f"event: {name}\n" if name else ""
                await resp.write(f"{head}data: {data}\n\n".encode())
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # the client went away (a killed Brain)
        return resp


# ---------------------------------------------------------------------- request checks

# OpenAI's chat models (gpt-*, the o-series): max_tokens is deprecated for all of them and
# refused by the reasoning models; refused here for all, so a client must send
# max_completion_tokens to OpenAI whatever the model.
COMPLETION_TOKENS_ONLY = re.compile(r"^(o\d|gpt-)")


def openai_invalid(body: dict[str, Any]) -> str:
    """Why OpenAI would refuse this request's order or fields (400), or ""."""
    if "max_tokens" in body and COMPLETION_TOKENS_ONLY.match(body.get("model", "")):
        return ("Unsupported parameter: 'max_tokens' is not supported with this model. "
                "Use 'max_completion_tokens' instead.")
    open_calls: list[str] = []
    for i, m in enumerate(body.get("messages") or ()):
        role = m.get("role")
        if role == "tool":
            if m.get("tool_call_id") not in open_calls:
                return (f"messages[{i}]: messages with role 'tool' must be a response to a "
                        "preceding message with 'tool_calls'")
            open_calls.remove(m["tool_call_id"])
            continue
        if open_calls:
            return ("An assistant message with 'tool_calls' must be followed by tool messages "
                    f"responding to each 'tool_call_id'. Missing: {', '.join(open_calls)} "
                    f"(messages[{i}] is {role!r})")
        if role == "assistant":
            open_calls = [c["id"] for c in m.get("tool_calls") or ()]
    if open_calls:
        return f"tool_calls without responses: {', '.join(open_calls)}"
    return ""


def anthropic_invalid(body: dict[str, Any]) -> str:
    """Why Anthropic would refuse this request's turns (400), or ""."""
    msgs = body.get("messages") or ()
    uses: list[str] = []
    for i, m in enumerate(msgs):
        if m["role"] != ("user" if i % 2 == 0 else "assistant"):
            return f"messages.{i}: roles must alternate between 'user' and 'assistant'"
        blocks = m["content"]
        kinds = [b["type"] for b in blocks]
        if m["role"] == "assistant":
            uses = [b["id"] for b in blocks if b["type"] == "tool_use"]
            continue
        results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
        if uses and kinds[: len(uses)] != ["tool_result"] * len(uses):
            return (f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    "immediately after: each tool_use block must have a corresponding "
                    "tool_result block in the next message, before any other content")
        if sorted(results) != sorted(uses):
            return f"messages.{i}: unexpected `tool_use_id` found in `tool_result` blocks"
        uses = []
    if uses:
        return "the conversation ends on `tool_use` blocks without their `tool_result`"
    return ""


# ---------------------------------------------------------------------- the scripted model


def answer(turn: Turn, b: Behaviour) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """(text, [(tool name, arguments)]) the way the scripted notices model answers."""
    if turn.user is None:
        return "There is nothing to do.", []
    if not turn.calls and "send_email" in turn.tools:
        recipients = list(dict.fromkeys(EMAIL.findall(turn.user)))
        calls = [("send_email", {"to": to, "subject": "Notice", "body": turn.user[:2000]})
                 for to in recipients]
        return b.preamble, calls
    if not turn.results:
        return b.preamble + "Done.", []
    lines = [f"{turn.calls.get(cid, '?')}: {_fate(text)}" for cid, text in turn.results]
    return (b.preamble + f"Summary of {len(lines)} notices: " + "; ".join(lines) + ".", [])


def _fate(text: str) -> str:
    try:
        result = json.loads(text)
    except ValueError:
        return "failed"
    if result.get("outcome") == "ok":
        return "confirmed after recovery" if result.get("recovery") == "confirmed" else "sent"
    return f"failed ({result.get('error_code') or result.get('outcome')})"


def openai_turn(body: dict[str, Any]) -> Turn:
    turn = Turn(tools={t["function"]["name"] for t in body.get("tools") or ()})
    msgs = body["messages"]
    for i, m in enumerate(msgs):
        if m["role"] == "user" and m["content"] == INTERRUPTED_NOTE:
            prev = msgs[i - 1] if i else {}
            turn.interrupted.append(prev.get("content") or "")
        elif m["role"] == "user":
            turn = Turn(user=m["content"], tools=turn.tools, interrupted=turn.interrupted)
        elif m["role"] == "assistant":
            for c in m.get("tool_calls") or ():
                args = json.loads(c["function"]["arguments"])
                turn.calls[c["id"]] = args.get("to", "?")
        elif m["role"] == "tool":
            turn.results.append((m["tool_call_id"], m["content"]))
    return turn


def anthropic_turn(body: dict[str, Any]) -> Turn:
    turn = Turn(tools={t["name"] for t in body.get("tools") or ()})
    last_assistant = ""
    for m in body["messages"]:
        for block in m["content"]:
            kind = block["type"]
            if m["role"] == "assistant" and kind == "text":
                last_assistant = block["text"]
            elif m["role"] == "assistant" and kind == "tool_use":
                turn.calls[block["id"]] = block["input"].get("to", "?")
            elif kind == "tool_result":
                turn.results.append((block["tool_use_id"], block["content"]))
            elif kind == "text" and block["text"] == INTERRUPTED_NOTE:
                turn.interrupted.append(last_assistant)
            elif kind == "text":
                turn = Turn(user=block["text"], tools=turn.tools, interrupted=turn.interrupted)
    return turn


def _words(text: str) -> list[str]:
    return re.findall(r"\S+\s*", text)


def _openai_error(status: int, kind: str, message: str,
                  headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": None}},
                             status=status, headers=headers)


def _anthropic_error(status: int, kind: str, message: str,
                     headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"type": "error", "error": {"type": kind, "message": message}},
                             status=status, headers=headers)


def _bearer(value: str | None) -> str | None:
    return value[len("Bearer "):] if value and value.startswith("Bearer ") else None
