"""The local model server of ``baton bench models``: it answers like OpenAI's chat
completions and Anthropic's messages (a fixed answer: :data:`WORDS` streamed text deltas and
one tool call, or the same as one JSON body), and on request (header ``x-bench-case``) with
the faults a provider can produce: a stream without its end, cut mid-answer, a malformed
event, 429 with ``Retry-After``, 400, a stalled stream. :class:`Server` runs it as a child
process, so its CPU is not the measuring process's."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

__all__ = ["ARGS", "TEXT", "WORDS", "Server"]

WORDS = 60  # streamed text deltas per answer
TEXT = " ".join(f"word{i}" for i in range(WORDS))
ARGS = {"to": "ada@example.com", "subject": "Notice", "body": "x" * 200}


def _openai_events() -> list[str]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return json.dumps({"id": "chatcmpl-b", "object": "chat.completion.chunk",
                           "created": 0, "model": "bench",
                           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    raw = json.dumps(ARGS)
    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": w + " "}) for w in TEXT.split()]
    out.append(chunk({"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
                                      "function": {"name": "send_email", "arguments": ""}}]}))
    out += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
            for part in (raw[:40], raw[40:])]
    out.append(chunk({}, "tool_calls"))
    out.append(json.dumps({"id": "chatcmpl-b", "object": "chat.completion.chunk", "created": 0,
                           "model": "bench", "choices": [],
                           "usage": {"prompt_tokens": 120, "completion_tokens": 80,
                                     "total_tokens": 200}}))
    out.append("[DONE]")
    return out


def _openai_json() -> dict[str, Any]:
    return {"id": "chatcmpl-b", "object": "chat.completion", "created": 0, "model": "bench",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": TEXT,
                "tool_calls": [{"id": "call_0", "type": "function", "function": {
                    "name": "send_email", "arguments": json.dumps(ARGS)}}]}}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 80, "total_tokens": 200}}


def _anthropic_message() -> dict[str, Any]:
    return {"id": "msg_b", "type": "message", "role": "assistant", "model": "bench",
            "content": [{"type": "text", "text": TEXT},
                        {"type": "tool_use", "id": "toolu_0", "name": "send_email",
                         "input": ARGS}],
            "stop_reason": "tool_use", "stop_sequence": None,
            "usage": {"input_tokens": 120, "output_tokens": 80}}


def _anthropic_events() -> list[tuple[str, str]]:
    msg = {**_anthropic_message(), "content": [], "stop_reason": None,
           "usage": {"input_tokens": 120, "output_tokens": 1}}
    ev: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": msg}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}})]
    ev += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                    "delta": {"type": "text_delta", "text": w + " "}})
           for w in TEXT.split()]
    raw = json.dumps(ARGS)
    ev += [("content_block_stop", {"type": "content_block_stop", "index": 0}),
           ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {
               "type": "tool_use", "id": "toolu_0", "name": "send_email", "input": {}}})]
    ev += [("content_block_delta", {"type": "content_block_delta", "index": 1,
                                    "delta": {"type": "input_json_delta", "partial_json": p}})
           for p in (raw[:40], raw[40:])]
    ev += [("content_block_stop", {"type": "content_block_stop", "index": 1}),
           ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use",
                                                                 "stop_sequence": None},
                              "usage": {"output_tokens": 80}}),
           ("message_stop", {"type": "message_stop"})]
    return [(name, json.dumps(data)) for name, data in ev]


def _shape(events: list[tuple[str, str]], case: str, end_events: int) -> list[tuple[str, str]]:
    """The events a case sends: all, without the end, cut in the middle, or one broken."""
    if case == "no_end":
        return events[:-end_events]
    if case == "cut":
        return events[: len(events) // 2]
    if case == "malformed":
        return [*events[:3], (events[3][0], '{"broken": '), *events[4:]]
    return events


async def _serve(port: int) -> None:
    from aiohttp import web

    openai_sse = [("", e) for e in _openai_events()]
    anthropic_sse = _anthropic_events()

    async def answer(request: web.Request, wire: str) -> web.StreamResponse:
        body = await request.json()
        case = request.headers.get("x-bench-case", "ok")
        if case in ("429", "400"):
            err = {"openai": {"error": {"message": "bench", "type": "rate_limit_error"}},
                   "anthropic": {"type": "error",
                                 "error": {"type": "rate_limit_error", "message": "bench"}}}
            return web.json_response(err[wire], status=int(case),
                                     headers={"retry-after": "2"} if case == "429" else {})
        if not body.get("stream"):
            data = _openai_json() if wire == "openai" else _anthropic_message()
            return web.json_response(data)
        events = openai_sse if wire == "openai" else anthropic_sse
        # OpenAI's end: the usage chunk and [DONE]; Anthropic's: message_stop.
        events = _shape(events, case, 2 if wire == "openai" else 1)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        if case == "stall":
            await asyncio.sleep(30)
        payload = "".join((f"event: {n}\n" if n else "") + f"data: {d}\n\n" for n, d in events)
        await resp.write(payload.encode())
        await resp.write_eof()
        return resp

    async def openai_handler(request: web.Request) -> web.StreamResponse:
        return await answer(request, "openai")

    async def anthropic_handler(request: web.Request) -> web.StreamResponse:
        return await answer(request, "anthropic")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", openai_handler)
    app.router.add_post("/v1/messages", anthropic_handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


class Server:
    """The answering server as a child process (its CPU is not this process's)."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Server:
        self.proc = subprocess.Popen([sys.executable, "-m", "baton.bench.model_server",
                                      str(self.port)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the bench model server did not start")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(_serve(int(sys.argv[1])))
