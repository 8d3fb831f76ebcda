"""Helpers for the HTTP API tests: serve the API in this event loop, read SSE streams."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import uvicorn

from baton.api.app import create_app
from baton.api.auth import Tokens
from baton.devkit.servers import free_port
from baton.settings import Settings

START_TIMEOUT_S = 30.0  # generous: a loaded machine starts the app slowly, a hang still ends


PROBLEM = "application/problem+json"


def auth(token: str) -> dict[str, str]:
    """The header presenting ``token``."""
    return {"Authorization": f"Bearer {token}"}


def problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """``r`` as an RFC 9457 problem of ``status`` and Baton's ``code``, never a traceback."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM), r.headers
    body = r.json()
    assert body["status"] == status and body["code"] == code, body
    assert body["type"] == f"urn:baton:problem:{code}" and body["title"] and body["detail"]
    assert "Traceback" not in r.text
    return dict(body)


@asynccontextmanager
async def serving_api(settings: Settings, tokens: Tokens,
                      reads: Settings | None = None) -> AsyncIterator[str]:
    """The API on a free loopback port while in the block; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(
        create_app(settings, tokens, reads), host="127.0.0.1", port=port, log_config=None,
        access_log=False, lifespan="on", timeout_graceful_shutdown=2))
    task = asyncio.create_task(server.serve())
    try:
        # uvicorn sets ``started`` without an event to wait on: polled, with a deadline, and
        # a server that ended during its start raises its own error.
        async with asyncio.timeout(START_TIMEOUT_S):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("the API stopped during start")
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


class SseReader:
    """Parses an SSE response into (event, data, id) tuples."""

    def __init__(self, response: httpx.Response) -> None:
        self.lines = response.aiter_lines()

    async def next(self) -> tuple[str, dict[str, Any], str | None]:
        event, data, ident = "message", "", None
        async for line in self.lines:
            if line == "":
                if data:
                    return event, json.loads(data), ident
                event, data, ident = "message", "", None
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(": ")
            if field == "event":
                event = value
            elif field == "data":
                data += value
            elif field == "id":
                ident = value
        raise EOFError("the stream ended")
