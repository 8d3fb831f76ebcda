"""hands.http against servers that answer badly on purpose: every request ends, before the
test's deadline, with a response within the client's bounds or a clean error (an httpx error
or one of the bounds' :class:`~baton.errors.HttpError`), and holds no more than its bound.

A raw TCP server on a free port (tests.raw_http_server) sends what each test scripts byte
for byte: framing and keep-alive reuse, what each failure proves about whether the request
left (hands.retries.classify), oversized and malformed heads, bad chunking, bodies past the
bound (by Content-Length, chunked, until close; endless), an endless body its caller stops
reading (back-pressure), compression bombs, a slow drip, a stall, endless interim answers, a
reset mid-body; then hypothesis composes answers of such parts. Nothing here sleeps to wait
or measures a gap: a request must end with the right error under a generous
``asyncio.timeout``, and the deadline tests' servers never finish at all.
"""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
import zlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from baton.errors import HttpError, RequestDeadlineExceeded, ResponseTooLarge
from baton.hands import retries
from baton.hands.http import ACCEPT_ENCODING, as_tool_error, http_client
from tests.helpers import eventually
from tests.raw_http_server import Answer, ok, raw_server

#: The body bound of these tests' clients, and what a test waits at most for one request.
LIMIT = 64 * 1024
TEST_DEADLINE_S = 60.0
#: A request's deadline where the server never finishes (else a generous one).
SHORT_DEADLINE_S = 0.5
#: What these tests let a request hold at its peak (Python allocations, server included),
#: against bodies that would otherwise grow without end or decode to 16 MiB.
PEAK_BYTES = 4 * 1024 * 1024

CLEAN = (httpx.HTTPError, HttpError)


def _ok_head(extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + extra


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _deflate_raw(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


async def _ends(request: Awaitable[Any]) -> Any:
    async with asyncio.timeout(TEST_DEADLINE_S):
        return await request


async def _read(http: httpx.AsyncClient, url: str, *, stream: bool, **kwargs: Any) -> bytes:
    """The body read whole (``get``) or as a stream (``client.stream``)."""
    if not stream:
        return (await http.get(url, **kwargs)).content
    async with http.stream("GET", url, **kwargs) as response:
        return b"".join([part async for part in response.aiter_bytes()])


# ---------------------------------------------------------------- framing and reuse


async def test_answers_are_read_as_framed_and_connections_reused() -> None:
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"4;ext=1\r\nabcd\r\n3\r\nefg\r\n0\r\nTrailer: x\r\n\r\n")

    def script(head: bytes, n: int) -> Answer:
        path = head.split(b" ")[1]
        if path == b"/chunked":
            return Answer(chunked)
        if path == b"/empty":
            return Answer(b"HTTP/1.1 204 No Content\r\n\r\n")
        if path == b"/interim":
            return Answer(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n"
                          b"Link: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nafter")
        if head.startswith(b"HEAD "):  # its length (past the bound), no body
            return Answer(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (LIMIT * 10))
        body = b"n=%d" % n
        return Answer(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Twice: 1\r\nX-Twice: 2\r\n"
                      b"\r\n%s" % (len(body), body))

    async with raw_server(script) as raw, http_client(2.0, max_body_bytes=LIMIT) as http:
        first = await http.post(f"{raw.url}/a?q=1", json={"k": "v"},
                                headers={"Idempotency-Key": "op-1"})
        assert first.status_code == 200 and first.content == b"n=1"
        assert first.headers.get_list("x-twice") == ["1", "2"]
        assert first.reason_phrase == "OK" and first.http_version == "HTTP/1.1"
        assert first.is_closed and first.elapsed.total_seconds() >= 0
        assert (await http.get(f"{raw.url}/chunked")).content == b"abcdefg"
        assert (await http.get(f"{raw.url}/empty")).content == b""
        head = await http.head(f"{raw.url}/x")
        assert head.content == b"" and head.headers["content-length"] == str(LIMIT * 10)
        assert (await http.get(f"{raw.url}/interim")).text == "after"
        assert raw.connections == 1  # one keep-alive connection served all
        sent = raw.requests[0]
        assert sent.startswith(b"POST /a?q=1 HTTP/1.1\r\n")
        assert b"\r\nidempotency-key: op-1\r\n" in sent.lower()
        assert b"\r\naccept-encoding: %s\r\n" % ACCEPT_ENCODING.encode() in sent.lower()
        assert sent.endswith(b'\r\n\r\n{"k":"v"}')


async def test_an_answer_that_closes_is_not_reused() -> None:
    def script(head: bytes, n: int) -> Answer:
        if head.startswith(b"GET /until-close"):
            return Answer(b"HTTP/1.1 200 OK\r\n\r\nall of it", then="close")
        if head.startswith(b"GET /old"):
            return Answer(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", then="close")
        return Answer(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
                      then="close")

    async with raw_server(script) as raw, http_client(2.0) as http:
        assert (await http.get(f"{raw.url}/until-close")).text == "all of it"
        assert (await http.get(f"{raw.url}/closes")).text == "hello"
        old = await http.get(f"{raw.url}/old")
        assert old.text == "ok" and old.http_version == "HTTP/1.0"
        assert (await http.get(f"{raw.url}/closes")).text == "hello"
        assert raw.connections == 4


async def test_a_lost_connection_resends_only_idempotent_requests() -> None:
    # The server answers the first request, then drops the connection on the next one
    # without answering: a GET goes again on a new connection, a POST does not.
    def script(head: bytes, n: int) -> Answer | None:
        body = b"n=%d" % n
        return None if n in (2, 4) else Answer(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

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

    def script(head: bytes, n: int) -> Answer:
        if b"/bad" in head:
            return Answer(b"HTTP/1.1 2x0 Nope\r\n\r\n", then="close")
        if b"/short" in head:
            return Answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", then="close")
        if b"/chunk/" in head:  # a size int(x, 16) would take but HTTP does not
            size = head.split(b" ")[1].rsplit(b"/", 1)[1]
            return Answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                          b"%s\r\nabcd\r\n0\r\n\r\n" % size, then="close")
        return Answer(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")

    async with raw_server(script) as raw, http_client(2.0) as http:
        raw.hold = hold  # the server answers nothing until the event is set
        with pytest.raises(httpx.ReadTimeout) as timed_out:
            await _ends(http.get(f"{raw.url}/slow", timeout=httpx.Timeout(2.0, read=0.2)))
        assert retries.classify(timed_out.value) == "ambiguous"
        raw.hold = None
        hold.set()
        with pytest.raises(httpx.RemoteProtocolError) as bad:
            await http.get(f"{raw.url}/bad")
        assert retries.classify(bad.value) == "ambiguous"
        with pytest.raises(httpx.RemoteProtocolError) as short:
            await http.get(f"{raw.url}/short")
        assert retries.classify(short.value) == "ambiguous"
        for size in (b"0x4", b"+4", b"0_4", b"-4", b"4 4", b"f" * 17):
            with pytest.raises(httpx.RemoteProtocolError, match=r"(?i)chunk size"):
                await http.get(f"{raw.url}/chunk/{size.decode().replace(' ', '%20')}")
        assert (await http.get(f"{raw.url}/chunk/4")).content == b"abcd"
        with pytest.raises(httpx.LocalProtocolError):
            await http.get(f"{raw.url}/x", headers={"X-Injected": "a\r\nEvil: 1"})
        assert (await http.get(f"{raw.url}/fine")).text == "hello"
    token = retries.deadline.set(None)
    try:
        async with http_client(0.5) as http:
            with pytest.raises(httpx.ConnectError) as refused:
                await _ends(http.get(raw.url))  # nothing listens there any more
    finally:
        retries.deadline.reset(token)
    assert retries.classify(refused.value) == "never_sent"


# ---------------------------------------------------------------- the bounds, one by one

TOO_LARGE: dict[str, Answer] = {
    # Refused by its Content-Length before a byte of the body is read.
    "content-length": Answer(_ok_head(b"Content-Length: %d\r\n\r\n" % (10**12)),
                             endless=b"x" * 4096),
    "chunked, endless": Answer(_ok_head(b"Transfer-Encoding: chunked\r\n\r\n"),
                               endless=b"1000\r\n" + b"x" * 4096 + b"\r\n"),
    "until close, endless": Answer(_ok_head(b"\r\n"), endless=b"x" * 4096),
    # A chunk that says it is huge and keeps coming
    "one huge chunk": Answer(_ok_head(b"Transfer-Encoding: chunked\r\n\r\nffffffffff\r\n"),
                             endless=b"x" * 4096),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("name", TOO_LARGE)
async def test_a_body_past_the_bound_is_refused_as_it_arrives(name: str, stream: bool) -> None:
    def script(head: bytes, n: int) -> Answer:
        return TOO_LARGE[name] if b" /big" in head else ok()

    async with raw_server(script) as raw, http_client(2.0, max_body_bytes=LIMIT) as http:
        tracemalloc.start()
        try:
            with pytest.raises(ResponseTooLarge) as caught:
                await _ends(_read(http, f"{raw.url}/big?token=secret", stream=stream))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        # the connection is not reused: the next request opens another
        assert (await _ends(http.get(raw.url))).text == "hello"
        assert raw.connections == 2
    error = caught.value
    assert (error.limit, error.decoded, error.code) == (LIMIT, False, "response_too_large")
    assert error.url == f"{raw.url}/big" and "secret" not in error.message
    assert retries.classify(error) == "final"  # the same answer would come again
    assert peak < PEAK_BYTES, f"{peak} bytes held for a body bound to {LIMIT}"


async def test_a_body_is_read_only_as_fast_as_the_caller_reads_it() -> None:
    # Back-pressure: with a body bound too large to matter, a caller that stops reading a
    # streamed body makes the server's endless sending stall (its socket buffers full), and
    # the client holds no more than its read buffers meanwhile.
    endless = Answer(_ok_head(b"\r\n"), endless=b"x" * 4096)
    async with raw_server(lambda head, n: endless) as raw, \
            http_client(2.0, max_body_bytes=2**40) as http:
        tracemalloc.start()
        try:
            async with http.stream("GET", f"{raw.url}/endless") as response:
                first = await _ends(anext(aiter(response.aiter_raw())))
                await eventually(lambda: raw.unsent() > 0, timeout=TEST_DEADLINE_S,
                                 message="the server, stalled by a client that stopped reading")
                peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert first
    assert peak < PEAK_BYTES, f"{peak} bytes held while the caller read {len(first)}"


DECODED = 16 * 1024 * 1024  # what each bomb decodes to: 256 times the bound
BOMBS: dict[str, tuple[bytes, bytes]] = {  # name -> (Content-Encoding, body)
    "gzip": (b"gzip", _gzip(bytes(DECODED))),
    "deflate": (b"deflate", zlib.compress(bytes(DECODED), 9)),
    "raw deflate": (b"deflate", _deflate_raw(bytes(DECODED))),
    "gzip twice": (b"gzip, gzip", _gzip(_gzip(bytes(DECODED)))),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize("name", BOMBS)
async def test_a_compression_bomb_is_refused_before_it_is_decoded(
        name: str, framing: str, stream: bool) -> None:
    coding, body = BOMBS[name]
    assert len(body) < LIMIT  # small as sent: only its decoded size is past the bound
    if framing == "length":
        answer = _ok_head(b"Content-Encoding: %s\r\nContent-Length: %d\r\n\r\n%s"
                          % (coding, len(body), body))
    else:
        answer = _ok_head(b"Content-Encoding: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
                          b"%x\r\n%s\r\n0\r\n\r\n" % (coding, len(body), body))
    async with raw_server(lambda head, n: Answer(answer)) as raw, \
            http_client(2.0, max_body_bytes=LIMIT) as http:
        tracemalloc.start()
        try:
            with pytest.raises(ResponseTooLarge) as caught:
                await _ends(_read(http, f"{raw.url}/bomb", stream=stream))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert (caught.value.limit, caught.value.decoded) == (LIMIT, True)
    assert "decoded body" in caught.value.message
    assert peak < PEAK_BYTES, f"{peak} bytes held for a bomb decoding to {DECODED}"


async def test_bodies_within_the_bound_decode_as_httpx_decodes_them() -> None:
    data = bytes(range(256)) * 200  # 51,200 bytes: under the bound decoded
    bodies = {b"/gzip": (b"gzip", _gzip(data)), b"/deflate": (b"deflate", zlib.compress(data)),
              b"/raw": (b"deflate", _deflate_raw(data)),
              b"/twice": (b"gzip, deflate", zlib.compress(_gzip(data))),
              b"/none": (b"identity", data), b"/unknown": (b"x-custom", data)}

    def script(head: bytes, n: int) -> Answer:
        coding, body = bodies[head.split(b" ")[1]]
        return Answer(_ok_head(b"Content-Encoding: %s\r\nContent-Length: %d\r\n\r\n%s"
                               % (coding, len(body), body)))

    async with raw_server(script) as raw, http_client(2.0, max_body_bytes=LIMIT) as http:
        for path in bodies:
            for stream in (False, True):
                assert await _read(http, f"{raw.url}{path.decode()}", stream=stream) == data


async def test_a_coding_not_asked_for_is_refused() -> None:
    answer = _ok_head(b"Content-Encoding: zstd\r\nContent-Length: 4\r\n\r\nabcd")
    async with raw_server(lambda head, n: Answer(answer)) as raw, http_client(2.0) as http:
        for coding in ("zstd", "br"):
            answer = _ok_head(b"Content-Encoding: %s\r\nContent-Length: 4\r\n\r\nabcd"
                              % coding.encode())
            raw.script = lambda head, n, answer=answer: Answer(answer)  # type: ignore[misc]
            with pytest.raises(httpx.DecodingError, match=f"{coding}-encoded"):
                await _ends(http.get(raw.url))
        assert b"accept-encoding: gzip, deflate\r\n" in raw.requests[0].lower()


SLOW: dict[str, Answer] = {
    "a body's slow drip": Answer(_ok_head(b"Content-Length: 100000\r\n\r\n"), drip=b"x"),
    "a chunked body's slow drip": Answer(_ok_head(b"Transfer-Encoding: chunked\r\n\r\n"),
                                         drip=b"1\r\nx\r\n"),
    "a head's slow drip": Answer(b"HTTP/1.1 200 OK\r\n", drip=b"X-Slow: 1\r\n"),
    "a body that never comes": Answer(_ok_head(b"Content-Length: 10\r\n\r\n"), then="stall"),
    "an answer that never comes": Answer(then="stall"),
    "endless interim answers": Answer(endless=b"HTTP/1.1 103 Early Hints\r\n\r\n"),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("name", SLOW)
async def test_slowness_ends_at_the_request_deadline(name: str, stream: bool) -> None:
    # The read timeout (30 s) never fires: bytes keep coming, or the deadline comes first.
    async with raw_server(lambda head, n: SLOW[name]) as raw, \
            http_client(2.0, deadline_s=SHORT_DEADLINE_S) as http:
        with pytest.raises(RequestDeadlineExceeded) as caught:
            await _ends(_read(http, f"{raw.url}/slow", stream=stream))
    assert caught.value.deadline_s == SHORT_DEADLINE_S
    assert caught.value.code == "request_deadline"
    assert retries.classify(caught.value) == "ambiguous"  # as after a read timeout


HEADS: dict[str, bytes] = {
    "a long status line": b"HTTP/1.1 200 " + b"O" * 9000 + b"\r\n\r\n",
    "a long header line": _ok_head(b"X-Long: " + b"v" * 9000 + b"\r\n\r\n"),
    "many header lines": _ok_head(b"X-N: v\r\n" * 200 + b"\r\n"),
    "many trailers": _ok_head(b"Transfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n"
                              + b"T: v\r\n" * 200 + b"\r\n"),
    "a long trailer": _ok_head(b"Transfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n"
                               b"T: " + b"v" * 9000 + b"\r\n\r\n"),
    "a NUL in a value": _ok_head(b"X: a\x00b\r\nContent-Length: 0\r\n\r\n"),
    "a bad status": b"HTTP/1.1 2x0 Nope\r\n\r\n",
    "not HTTP": b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    "two lengths": _ok_head(b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"),
    "a length and chunked": _ok_head(b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
                                     b"4\r\nabcd\r\n0\r\n\r\n"),
    "a negative length": _ok_head(b"Content-Length: -1\r\n\r\n"),
    "a chunk without its CRLF": _ok_head(b"Transfer-Encoding: chunked\r\n\r\n4\r\nabcdXY"
                                         b"0\r\n\r\n"),
}
ENDLESS_HEADS: dict[str, Answer] = {
    "endless header lines": Answer(b"HTTP/1.1 200 OK\r\n", endless=b"X-A: b\r\n"),
    "an endless header line": Answer(b"HTTP/1.1 200 OK\r\nX-A: ", endless=b"b" * 1024),
    "an endless status line": Answer(b"HTTP/1.1 200 ", endless=b"O" * 1024),
    "endless trailers": Answer(_ok_head(b"Transfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n"),
                               endless=b"T: v\r\n"),
}


@pytest.mark.parametrize("name", [*HEADS, *ENDLESS_HEADS])
async def test_oversized_and_malformed_heads_are_refused(name: str) -> None:
    answer = ENDLESS_HEADS.get(name) or Answer(HEADS[name], then="close")
    async with raw_server(lambda head, n: answer) as raw, http_client(2.0) as http:
        tracemalloc.start()
        try:
            with pytest.raises(httpx.RemoteProtocolError) as caught:
                await _ends(http.get(f"{raw.url}/x"))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert retries.classify(caught.value) == "ambiguous"
    assert peak < PEAK_BYTES


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_reset_mid_body_is_a_clean_error_a_tool_returns(stream: bool) -> None:
    answer = Answer(_ok_head(b"Content-Length: 100000\r\n\r\n") + b"x" * 1000, then="reset")
    async with raw_server(lambda head, n: answer) as raw, http_client(2.0) as http:
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)) as caught:
            await _ends(_read(http, f"{raw.url}/reset?key=secret", stream=stream))
    assert retries.classify(caught.value) == "ambiguous"
    returned = as_tool_error(caught.value)
    assert returned.code == "http_error" and returned.method == "GET"
    assert returned.url == f"{raw.url}/reset" and "secret" not in returned.message
    assert returned.error == type(caught.value).__name__


async def test_a_request_may_ask_for_its_own_bounds() -> None:
    body = b"x" * (LIMIT * 2)
    answer = Answer(_ok_head(b"Content-Length: %d\r\n\r\n%s" % (len(body), body)))
    async with raw_server(lambda head, n: answer) as raw, \
            http_client(2.0, max_body_bytes=LIMIT, deadline_s=SHORT_DEADLINE_S) as http:
        with pytest.raises(ResponseTooLarge):
            await _ends(http.get(raw.url))
        got = await _ends(http.get(raw.url, extensions={"max_body_bytes": len(body),
                                                        "deadline_s": TEST_DEADLINE_S}))
        assert got.content == body
        with pytest.raises(ResponseTooLarge) as smaller:
            await _ends(http.get(raw.url, extensions={"max_body_bytes": 1024}))
        assert smaller.value.limit == 1024


# ---------------------------------------------------------------- composed by hypothesis

#: The property test's bound: small, so that generated bodies cross it.
SMALL_LIMIT = 4096


@dataclass(frozen=True)
class Refused:
    """The error a well-formed answer must end with; ``decoded``: a ResponseTooLarge's
    (None: either bound may be met first)."""

    error: type[Exception]
    decoded: bool | None = None


@dataclass(frozen=True)
class Plan:
    """An answer built from parts, and what a correct client must make of it when every
    part is well formed: its body decoded, or a :class:`Refused`. None: the answer is
    malformed somewhere, and any clean outcome will do."""

    answer: Answer
    expect: bytes | Refused | None


GOOD_STATUS = [b"HTTP/1.1 200 OK", b"HTTP/1.0 200 OK", b"HTTP/1.1 404 Not Found",
               b"HTTP/1.1 500 Oops"]
BAD_STATUS = [b"HTTP/1.1 2x0 Nope", b"HTTP/1.1 99 Low", b"HTTP/1.1 1000 High", b"HTTP/2 200",
              b"HTTX/1.1 200 OK", b"HTTP/1.1 200 OK\x00", b"", b"HTTP/1.1 101 Switching",
              b"HTTP/1.1 200 " + b"r" * 9000]
INTERIM = [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n",
           b"HTTP/1.1 102 Processing\r\n\r\n"]
GOOD_HEADERS = [b"X-A: 1", b"Set-Cookie: sid=1; Path=/", b"Link: </a>; rel=preload",
                b"Content-Type: text/plain; charset=utf-8", b"X-Empty:", b"X-Latin: caf\xe9"]
BAD_HEADERS = [b"No colon", b" X-Folded: 1", b"X Space: 1", b"X-Nul: a\x00b", b": no name",
               b"X-Long: " + b"v" * 9000, b"Content-Length: 7", b"Transfer-Encoding: gzip",
               b"Content-Encoding: gzip", b"Content-Length: x", b"Transfer-Encoding: chunked",
               b"\r", b"\x80\xff: v"]
#: Content-Encoding -> how the data is encoded (the raw deflate is sent as "deflate").
CODINGS: dict[str, Callable[[bytes], bytes]] = {
    "": lambda d: d, "identity": lambda d: d, "gzip": _gzip, "deflate": zlib.compress,
    "deflate raw": _deflate_raw, "gzip, gzip": lambda d: _gzip(_gzip(d)),
    "gzip, deflate": lambda d: zlib.compress(_gzip(d)), "zstd": lambda d: d, "br": lambda d: d}
BAD_CHUNKS = [b"0x4\r\nabcd\r\n", b"-4\r\nabcd\r\n", b"zz\r\n", b"4\r\nabcdXY",
              b"ffffffffffffffffff\r\nab", b"4;" + b"e" * 9000 + b"\r\nabcd\r\n", b"\r\n",
              b"4\r\nab"]
#: Well-formed framings thrice as often as each malformed one.
FRAMINGS = ["length", "chunked", "close"] * 3 + ["length short", "length long", "bad chunks",
                                                 "endless"]


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    clean = True

    def pick(good: list[bytes], bad: list[bytes], odds: int) -> bytes:
        nonlocal clean
        if draw(st.integers(0, odds)) == 0:
            clean = False
            return draw(st.sampled_from(bad) | st.binary(max_size=40))
        return draw(st.sampled_from(good))

    status = pick(GOOD_STATUS, BAD_STATUS, odds=8)
    interim = b"".join(draw(st.lists(st.sampled_from(INTERIM), max_size=3)))
    headers = [pick(GOOD_HEADERS, BAD_HEADERS, odds=10) for _ in range(draw(st.integers(0, 4)))]
    data = draw(st.binary(max_size=SMALL_LIMIT * 2)
                | st.integers(1, 64).map(lambda k: bytes(k * SMALL_LIMIT)))  # compresses well
    coding = draw(st.sampled_from(sorted(CODINGS)))
    body = CODINGS[coding](data)
    if coding:
        headers.append(b"Content-Encoding: " + coding.replace(" raw", "").encode())
    framing = draw(st.sampled_from(FRAMINGS))
    if framing.startswith("length"):
        declared = len(body) + {"length": 0, "length short": -1, "length long": 7}[framing]
        headers.append(b"Content-Length: %d" % max(declared, 0))
        payload = body
    elif framing in ("chunked", "bad chunks"):
        headers.append(b"Transfer-Encoding: chunked")
        cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4)))
        pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p)
        if framing == "bad chunks":
            payload += draw(st.sampled_from(BAD_CHUNKS))
        payload += b"0\r\n\r\n"
    else:
        payload = body  # delimited by the close, or followed by endless more
    then = draw(st.sampled_from(["close", "close", "close", "reset"]))
    head = status + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n"
    answer = Answer(interim + head + payload, then=then,  # type: ignore[arg-type]
                    endless=b"x" * 1024 if framing == "endless" else b"")
    if not clean or then == "reset" or framing not in ("length", "chunked", "close") \
            or (status.startswith(b"HTTP/1.0") and framing == "chunked"):
        return Plan(answer, None)
    return Plan(answer, _expected(coding, framing, body, data))


def _expected(coding: str, framing: str, body: bytes, data: bytes) -> bytes | Refused:
    """What the client must make of a well-formed answer: a refusal, or the data."""
    if coding in ("zstd", "br"):
        return Refused(httpx.DecodingError)
    if len(body) > SMALL_LIMIT:  # by its Content-Length at once, else as it arrives
        return Refused(ResponseTooLarge, False if framing == "length" else None)
    if len(data) > SMALL_LIMIT:
        return Refused(ResponseTooLarge, True)
    return data


async def _play(plan: Plan) -> None:
    async with raw_server(lambda head, n: plan.answer) as raw, \
            http_client(2.0, max_body_bytes=SMALL_LIMIT, deadline_s=TEST_DEADLINE_S) as http:
        try:
            got = await _ends(http.get(f"{raw.url}/plan?q=1"))
        except CLEAN as exc:
            assert not isinstance(exc, httpx.TimeoutException | RequestDeadlineExceeded), \
                "every plan's server ends its answer: nothing may wait for a timer"
            event(f"{type(exc).__name__}{' (expected)' if plan.expect else ''}")
            returned = as_tool_error(exc)  # what a tool that let it escape returns
            assert (returned.method, returned.url) == ("GET", f"{raw.url}/plan")
            assert plan.expect is None or isinstance(plan.expect, Refused), \
                f"{exc!r} for a well-formed answer"
            if isinstance(plan.expect, Refused):
                assert isinstance(exc, plan.expect.error), f"{exc!r}, not {plan.expect}"
                if isinstance(exc, ResponseTooLarge) and plan.expect.decoded is not None:
                    assert exc.decoded is plan.expect.decoded
            return
        event(f"answered{' (expected)' if plan.expect else ''}")
        assert len(got.content) <= SMALL_LIMIT and got.num_bytes_downloaded <= SMALL_LIMIT
        assert plan.expect is None or isinstance(plan.expect, bytes), \
            f"{got!r} where {plan.expect} was due"
        if isinstance(plan.expect, bytes):
            assert got.content == plan.expect


SMALL_BOMB = _gzip(bytes(2**21))  # 2 KiB, decoding to 2 MiB
BOMB_PLAN = Plan(Answer(_ok_head(b"Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n")
                        + b"%x\r\n%s\r\n0\r\n\r\n" % (len(SMALL_BOMB), SMALL_BOMB),
                        then="close"), Refused(ResponseTooLarge, True))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans())
@example(plan=BOMB_PLAN)
def test_any_answer_ends_cleanly_within_the_bounds(plan: Plan) -> None:
    asyncio.run(_play(plan))


@pytest.fixture(autouse=True)
def _no_tracing_left() -> Iterator[None]:
    yield
    if tracemalloc.is_tracing():  # a failed test must not slow the next ones
        tracemalloc.stop()
