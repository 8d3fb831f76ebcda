"""The API refuses a body over its limit with 413 before reading it whole (a 150 MB
submission was parsed, half a gigabyte of memory, to be refused as too long)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI, Request
from pydantic import BaseModel

from baton.api import problems


class Body(BaseModel):
    text: str


def _app() -> FastAPI:
    app = FastAPI()
    problems.install(app, max_body=1000)

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"read": len(await request.body())}

    @app.post("/json")
    async def parsed(body: Body) -> dict[str, int]:  # FastAPI parses (and catches) itself
        return {"read": len(body.text)}

    return app


async def test_a_body_over_the_limit_is_refused_declared_or_chunked() -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()),
                                 base_url="http://api") as http:
        small = await http.post("/echo", content=b"x" * 1000)
        assert small.status_code == 200 and small.json() == {"read": 1000}
        declared = await http.post("/echo", content=b"x" * 1001)
        assert declared.status_code == 413
        assert declared.json()["code"] == "payload_too_large"

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(5):
                yield b"x" * 400

        chunked = await http.post("/echo", content=chunks())
        assert chunked.status_code == 413
        # a parsed JSON body: FastAPI turned the cut-off read into its own 400
        parsed = await http.post("/json", content=chunks(),
                                 headers={"Content-Type": "application/json"})
        assert parsed.status_code == 413, parsed.text
        assert parsed.json()["code"] == "payload_too_large"
