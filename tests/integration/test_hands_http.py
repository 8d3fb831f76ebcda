"""hands.http: the client shared by every tool call keeps nothing one call received for another.

Against a real HTTP server on a free port that sets a cookie on one path and echoes the
``Cookie`` header it receives on another.
"""

from __future__ import annotations

import gzip
import json
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

    async def sized(request: web.Request) -> web.Response:
        size = int(request.query.get("size", "0"))
        headers = {"X-Repeated": "a", "X-Latin": "caf\u00e9"}
        if request.query.get("gzip"):
            body = gzip.compress(b"x" * size)
            headers["Content-Encoding"] = "gzip"
            return web.Response(body=body, headers=headers)
        return web.Response(body=b"x" * size, headers=headers)

    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for part in (b"one,", b"two,", b"three"):
            await response.write(part)
        await response.write_eof()
        return response

    async def headers(request: web.Request) -> web.Response:
        return web.json_response({"items": [[k, v] for k, v in request.raw_headers]},
                                 dumps=lambda o: json.dumps(o, default=bytes.decode))

    app = web.Application()
    app.router.add_get("/sized", sized)
    app.router.add_get("/chunked", chunked)
    app.router.add_get("/headers", headers)
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


@pytest.mark.parametrize("size", [0, 10, 64 * 1024, 1024 * 1024])
async def test_a_response_reads_whole_or_streams_with_the_same_effects(
        server: str, size: int) -> None:
    async with http_client(2.0) as http:
        got = await http.get(f"{server}/sized", params={"size": size})
        assert got.content == b"x" * size and got.num_bytes_downloaded == size
        assert got.is_closed and got.is_stream_consumed
        assert got.elapsed.total_seconds() >= 0
        assert got.headers["content-length"] == str(size)
        assert got.headers.get_list("x-repeated") == ["a"]
        async with http.stream("GET", f"{server}/sized", params={"size": size}) as streamed:
            assert not streamed.is_stream_consumed
            parts = [part async for part in streamed.aiter_bytes()]
            assert b"".join(parts) == b"x" * size
            assert streamed.is_stream_consumed and streamed.is_closed
            with pytest.raises(httpx.StreamConsumed):
                await streamed.aread()
        assert streamed.elapsed.total_seconds() >= 0
        # Released to the pool either way: the next request reuses the connection.
        assert (await http.get(f"{server}/sized", params={"size": 3})).content == b"xxx"


async def test_encoded_chunked_and_non_ascii_responses_read_as_httpx_reads_them(
        server: str) -> None:
    async with http_client(2.0) as http:
        got = await http.get(f"{server}/sized", params={"size": 100, "gzip": 1})
        assert got.headers["content-encoding"] == "gzip"
        assert got.content == b"x" * 100  # decoded by httpx, as before
        assert got.headers["x-latin"] == "caf\u00e9"  # utf-8 bytes, decoded as httpx does
        assert got.headers.encoding == "utf-8"
        chunked = await http.get(f"{server}/chunked")
        assert chunked.text == "one,two,three"
        async with http.stream("GET", f"{server}/chunked") as streamed:
            assert [line async for line in streamed.aiter_lines()] == ["one,two,three"]


async def test_request_headers_go_out_as_given(server: str) -> None:
    async with http_client(2.0) as http:
        sent = await http.get(f"{server}/headers", headers=[
            ("X-Twice", "1"), ("X-Twice", "2"), ("Idempotency-Key", "op-1")])
        items = [(k.lower(), v) for k, v in sent.json()["items"]]
        assert ("x-twice", "1") in items and ("x-twice", "2") in items
        assert ("idempotency-key", "op-1") in items
        assert sum(1 for k, _ in items if k == "user-agent") == 1
        assert sent.request.headers["idempotency-key"] == "op-1"


async def test_auth_hooks_redirects_and_closing_behave_as_in_httpx(server: str) -> None:
    seen: list[str] = []

    async def on_request(request: httpx.Request) -> None:
        seen.append(f"request {request.url.path}")

    async def on_response(response: httpx.Response) -> None:
        seen.append(f"response {response.status_code}")

    async with http_client(2.0) as http:
        sent = (await http.get(f"{server}/headers", auth=("user", "pw"))).json()
        assert any(k.lower() == "authorization" for k, _ in sent["items"])
        not_followed = await http.get(f"{server}/redirect")
        assert not_followed.status_code == 302 and not_followed.next_request is not None
        assert not_followed.is_closed and not_followed.elapsed.total_seconds() >= 0
        http.event_hooks = {"request": [on_request], "response": [on_response]}
        assert (await http.get(f"{server}/redirect", follow_redirects=True)).status_code == 200
        assert seen == ["request /redirect", "response 302", "request /echo", "response 200"]
    with pytest.raises(RuntimeError, match="client has been closed"):
        await http.get(f"{server}/echo")
