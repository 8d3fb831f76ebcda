"""hands.http1: the lean HTTP/1.1 client the shared tool client sends plain-http requests
through when their whole answer is wanted.

Against a raw TCP server on a free port whose answers each test scripts byte for byte:
framing (length, chunked, until close, none), keep-alive reuse and its limits, what each
failure proves about whether the request left (hands.retries.classify), and the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import httpx
import pytest

from baton.hands import retries
from baton.hands.http import http_client
from baton.hands.http1 import Http1Pool
from tests.helpers import eventually

Script = Callable[[bytes, int], bytes | None]  # (request head, index) -> raw answer


@dataclass
class RawServer:
    """Answers each request on a connection with ``script(head, n)`` (None: close without
    answering); counts connections and requests."""

    script: Script
    url: str = ""
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    hold: asyncio.Event | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                if self.hold is not None:
                    await self.hold.wait()
                answer = self.script(head, len(self.requests))
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                framed = b"content-length" in answer.lower() or b"chunked" in answer.lower() \
                    or answer.startswith(b"HTTP/1.1 204")
                if b"connection: close" in answer.lower() or not framed:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def raw_server(script: Script) -> AsyncIterator[RawServer]:
    raw = RawServer(script)
    server = await asyncio.start_server(raw.serve, "127.0.0.1", 0)
    raw.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield raw
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2)


def ok(body: bytes = b"hello", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def test_answers_are_read_as_framed_and_connections_reused() -> None:
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"4;ext=1\r\nabcd\r\n3\r\nefg\r\n0\r\nTrailer: x\r\n\r\n")

    def script(head: bytes, n: int) -> bytes:
        path = head.split(b" ")[1]
        if path == b"/chunked":
            return chunked
        if path == b"/empty":
            return b"HTTP/1.1 204 No Content\r\n\r\n"
        if path == b"/interim":
            return b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"after")
        if head.startswith(b"HEAD "):  # its length, no body
            return b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
        return ok(b"n=%d" % n, b"X-Twice: 1\r\nX-Twice: 2\r\n")

    async with raw_server(script) as raw, http_client(2.0) as http:
        first = await http.post(f"{raw.url}/a?q=1", json={"k": "v"},
                                headers={"Idempotency-Key": "op-1"})
        assert first.status_code == 200 and first.content == b"n=1"
        assert first.headers.get_list("x-twice") == ["1", "2"]
        assert first.reason_phrase == "OK" and first.http_version == "HTTP/1.1"
        assert first.is_closed and first.elapsed.total_seconds() >= 0
        assert (await http.get(f"{raw.url}/chunked")).content == b"abcdefg"
        assert (await http.get(f"{raw.url}/empty")).content == b""
        assert (await http.head(f"{raw.url}/x")).content == b""
        assert (await http.get(f"{raw.url}/interim")).text == "after"
        assert raw.connections == 1  # one keep-alive connection served all
        sent = raw.requests[0]
        assert sent.startswith(b"POST /a?q=1 HTTP/1.1\r\nHost: 127.0.0.1:")
        assert b"\r\nidempotency-key: op-1\r\n" in sent.lower()
        assert sent.endswith(b'\r\n\r\n{"k":"v"}')


async def test_an_answer_that_closes_is_not_reused() -> None:
    def script(head: bytes, n: int) -> bytes:
        if head.startswith(b"GET /until-close"):
            return b"HTTP/1.1 200 OK\r\n\r\nall of it"
        if head.startswith(b"GET /old"):
            return b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"
        return ok(extra=b"Connection: close\r\n")

    async with raw_server(script) as raw, http_client(2.0) as http:
        assert (await http.get(f"{raw.url}/until-close")).text == "all of it"
        assert (await http.get(f"{raw.url}/closes")).text == "hello"
        assert (await http.get(f"{raw.url}/old")).text == "ok"
        assert (await http.get(f"{raw.url}/closes")).text == "hello"
        assert raw.connections == 4


async def test_a_lost_connection_resends_only_idempotent_requests() -> None:
    # The server answers the first request, then drops the connection on the next one
    # without answering: a GET goes again on a new connection, a POST does not.
    def script(head: bytes, n: int) -> bytes | None:
        return None if n in (2, 4) else ok(b"n=%d" % n)

    async with raw_server(script) as raw, http_client(2.0) as http:
        assert (await http.get(f"{raw.url}/a")).text == "n=1"
        assert (await http.get(f"{raw.url}/b")).text == "n=3"  # 2 was dropped, resent
        assert raw.connections == 2
        with pytest.raises(httpx.RemoteProtocolError) as caught:
            await http.post(f"{raw.url}/c", content=b"x")  # 4 dropped: not resent
        assert retries.classify(caught.value) == "ambiguous"
        assert len(raw.requests) == 4


async def test_failures_say_whether_the_request_left() -> None:
    hold = asyncio.Event()

    def script(head: bytes, n: int) -> bytes | None:
        if b"/bad" in head:
            return b"HTTP/1.1 2x0 Nope\r\n\r\n"
        if b"/short" in head:
            return b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nabc"
        if b"/chunk/" in head:  # a size int(x, 16) would take but HTTP does not
            size = head.split(b" ")[1].rsplit(b"/", 1)[1]
            return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close"
                    b"\r\n\r\n%s\r\nabcd\r\n0\r\n\r\n" % size)
        return ok()

    async with raw_server(script) as raw, http_client(2.0) as http:
        raw.hold = hold
        with pytest.raises(httpx.ReadTimeout) as timed_out:
            await http.get(f"{raw.url}/slow", timeout=httpx.Timeout(2.0, read=0.2))
        assert retries.classify(timed_out.value) == "ambiguous"
        raw.hold = None
        hold.set()
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get(f"{raw.url}/bad")
        with pytest.raises(httpx.RemoteProtocolError) as short:
            await http.get(f"{raw.url}/short")
        assert retries.classify(short.value) == "ambiguous"
        for size in (b"0x4", b"+4", b"0_4", b"-4"):
            with pytest.raises(httpx.RemoteProtocolError, match="malformed chunk size"):
                await http.get(f"{raw.url}/chunk/{size.decode()}")
        assert (await http.get(f"{raw.url}/chunk/4")).content == b"abcd"
        with pytest.raises(httpx.LocalProtocolError):
            await http.get(f"{raw.url}/x", headers={"X-Injected": "a\r\nEvil: 1"})
        assert (await http.get(f"{raw.url}/fine")).text == "hello"
    token = retries.deadline.set(None)
    try:
        async with http_client(0.5) as http:
            with pytest.raises(httpx.ConnectError) as refused:
                await http.get(raw.url)  # nothing listens there any more
    finally:
        retries.deadline.reset(token)
    assert retries.classify(refused.value) == "never_sent"


async def test_the_pool_bounds_connections_and_frees_them_on_cancel() -> None:
    hold = asyncio.Event()

    async with raw_server(lambda head, n: ok()) as raw:
        raw.hold = hold
        pool = Http1Pool(limit=1, keepalive_s=5.0)
        timeout = {"connect": 1.0, "read": 5.0, "pool": 0.2}
        request = httpx.Request("GET", f"{raw.url}/x", extensions={"timeout": timeout})
        first = asyncio.ensure_future(pool.request(request, b""))
        await eventually(lambda: raw.connections == 1, message="the first holds the slot")
        with pytest.raises(httpx.PoolTimeout) as waited:
            await pool.request(request, b"")
        assert retries.classify(waited.value) == "never_sent"
        first.cancel()  # its connection is closed, its slot freed
        with contextlib.suppress(asyncio.CancelledError):
            await first
        raw.hold = None
        hold.set()
        answer = await pool.request(request, b"")
        assert answer.status == 200 and answer.body == b"hello"
        assert pool.opened == 2
        pool.close()


async def test_streamed_and_https_requests_go_through_aiohttp() -> None:
    async with raw_server(lambda head, n: ok(b"streamed")) as raw, http_client(2.0) as http:
        async with http.stream("GET", f"{raw.url}/s") as streamed:
            assert await streamed.aread() == b"streamed"
        transport = http._transport.inner  # type: ignore[attr-defined]
        assert transport._http1.opened == 0  # aiohttp's pool served it
