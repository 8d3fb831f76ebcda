"""hands.http: the client shared by every tool call keeps nothing one call received for another.

Against a real HTTP server on a free port that sets a cookie on one path and echoes the
``Cookie`` header it receives on another.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web

from baton.errors import ConfigError
from baton.hands import retries
from baton.hands.http import URL_CACHE_SIZE, http_client


@pytest.fixture
async def server() -> AsyncIterator[str]:
    async def set_cookie(request: web.Request) -> web.Response:
        response = web.json_response({"session": request.query.get("session")})
        response.set_cookie("sid", request.query.get("session", "a"), path="/")
        return response

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"cookie": request.headers.get("Cookie"),
                                  "path": request.path, "query": request.query_string})

    async def redirect(request: web.Request) -> web.Response:
        response = web.HTTPFound("/echo")
        response.set_cookie("sid", "from-redirect", path="/")
        raise response

    app = web.Application()
    app.router.add_get("/set", set_cookie)
    app.router.add_get("/redirect", redirect)
    app.router.add_route("*", "/echo", echo)
    app.router.add_route("*", "/other/echo", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_cookie_one_call_received_is_never_sent_with_another(server: str) -> None:
    async with http_client(2.0) as http:
        got = await http.get(f"{server}/set", params={"session": "one"})
        assert got.status_code == 200
        assert got.cookies["sid"] == "one"  # the response itself shows what was set
        assert not http.cookies  # ...but the shared client kept nothing
        echoed = (await http.post(f"{server}/echo", json={"x": 1})).json()
        assert echoed["cookie"] is None
        # A redirect's cookie is not carried to the next hop either.
        followed = await http.get(f"{server}/redirect", follow_redirects=True)
        assert followed.json()["cookie"] is None


async def test_cookies_cannot_be_stored_on_the_shared_client(server: str) -> None:
    async with http_client(2.0) as http:
        with pytest.raises(ConfigError, match="keeps no cookies"):
            http.cookies.set("sid", "x")
        with pytest.raises(ConfigError, match="keeps no cookies"):
            http.cookies["sid"] = "x"
        with pytest.raises(ConfigError, match="keeps no cookies"):
            http.cookies = {"sid": "x"}  # type: ignore[assignment]
        # A cookie given with one request goes with that request only.
        echoed = (await http.get(f"{server}/echo", headers={"Cookie": "sid=mine"})).json()
        assert echoed["cookie"] == "sid=mine"
        assert (await http.get(f"{server}/echo")).json()["cookie"] is None
    with pytest.raises(ConfigError):
        http_client(2.0, cookies={"sid": "x"})


async def test_urls_resolve_after_the_base_changes_and_past_the_cache(server: str) -> None:
    async with http_client(2.0, base_url=server) as http:
        assert (await http.get("/echo")).json()["path"] == "/echo"
        http.base_url = httpx.URL(f"{server}/other/")
        assert (await http.get("echo")).json()["path"] == "/other/echo"
        for i in range(URL_CACHE_SIZE + 3):  # more distinct URLs than are kept
            answer = (await http.get(f"{server}/echo?i={i}")).json()
            assert answer["query"] == f"i={i}"
        assert (await http.get(f"{server}/echo?i=0")).json()["query"] == "i=0"


async def test_a_refused_connection_is_classified_never_sent() -> None:
    # A port nothing listens on: the request provably never left.
    async with http_client(0.5) as http:
        token = retries.deadline.set(None)
        try:
            # httpx_aiohttp maps it to ConnectTimeout; the aiohttp cause is what classifies
            with pytest.raises(httpx.TransportError) as caught:
                await http.get("http://127.0.0.1:9/")
        finally:
            retries.deadline.reset(token)
    assert retries.classify(caught.value) == "never_sent"
