"""A lean HTTP/1.1 client for the shared tool client's plain-``http`` requests read whole.

aiohttp spends about 120 us of CPU per request on work a request whose whole answer is
wanted does not need (its request and response objects, a body-writer task per POST, a
payload stream). :class:`Http1Pool` sends such a request (``http``, a body already in
memory, no ``Expect``/``Upgrade``) over a keep-alive connection of its own and reads the
answer whole: the status line and headers, then the body as framed (``Content-Length``,
chunked, or until the server closes). Everything else (``https``, streamed request bodies,
``client.stream``) keeps going through aiohttp.

What the errors prove is what :func:`baton.hands.retries.classify` needs to know:

    before the request left (connect refused or timed out, name resolution, no free
    connection within the pool timeout)      ConnectError / ConnectTimeout / PoolTimeout
    after (reset, the server closed, a read timed out, a malformed answer)
                                             ReadError / ReadTimeout / RemoteProtocolError

As aiohttp does, an idempotent request (GET, HEAD, PUT, DELETE, OPTIONS, TRACE) whose
connection was lost before its answer began is sent once more on a new connection; any
other method's is not. A connection is reused only after a complete answer that did not ask
to close it, and closed after ``keepalive_s`` idle.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx

__all__ = ["Answer", "Http1Pool"]

#: Limits of what a server may send before the body.
MAX_HEAD = 64 * 1024
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"})
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")


class _Lost(Exception):
    """The connection ended before the answer began (a retry may be allowed)."""


class Answer:
    """A response read whole: status, reason, HTTP version, raw headers, body."""

    __slots__ = ("body", "headers", "reason", "status", "version")

    def __init__(self, status: int, reason: bytes, version: bytes,
                 headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status = status
        self.reason = reason
        self.version = version
        self.headers = headers
        self.body = body


class _Connection(asyncio.Protocol):
    """One TCP connection: bytes in a buffer, a waiter woken by data or by the end."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.closed = False
        self.error: BaseException | None = None
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def more(self, timeout: float | None) -> None:  # noqa: ASYNC109
        """Wait for more bytes (or the end) at most ``timeout`` s: ReadTimeout after."""
        if self.closed:
            return
        self._waiter = self.loop.create_future()
        try:
            async with asyncio.timeout(timeout):
                await self._waiter
        except TimeoutError:
            raise httpx.ReadTimeout("timed out reading the answer") from None
        finally:
            self._waiter = None

    def _ended(self, what: str) -> Exception:
        if self.error is not None:
            return httpx.ReadError(f"{what}: {self.error!r}")
        return httpx.RemoteProtocolError(f"Server disconnected {what}")

    async def until(self, mark: bytes, limit: int, timeout: float | None,  # noqa: ASYNC109
                    what: str) -> bytes:
        """The bytes before ``mark`` (consumed with it)."""
        while True:
            end = self.buffer.find(mark)
            if end >= 0:
                found = bytes(self.buffer[:end])
                del self.buffer[:end + len(mark)]
                return found
            if len(self.buffer) > limit:
                raise httpx.RemoteProtocolError(f"{what} is longer than {limit} bytes")
            if self.closed:
                raise self._ended(f"in the middle of {what}")
            await self.more(timeout)

    async def exactly(self, size: int, timeout: float | None) -> bytes:  # noqa: ASYNC109
        while len(self.buffer) < size:
            if self.closed:
                raise self._ended("in the middle of the body")
            await self.more(timeout)
        found = bytes(self.buffer[:size])
        del self.buffer[:size]
        return found

    async def rest(self, timeout: float | None) -> bytes:  # noqa: ASYNC109
        while not self.closed:
            await self.more(timeout)
        if self.error is not None:
            raise httpx.ReadError(f"in the middle of the body: {self.error!r}")
        found = bytes(self.buffer)
        self.buffer.clear()
        return found


class Http1Pool:
    """Keep-alive connections by (host, port), at most ``limit`` open in all."""

    def __init__(self, limit: int = 100, keepalive_s: float = 5.0) -> None:
        self.limit = limit
        self.keepalive_s = keepalive_s
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._open = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._sweep: asyncio.TimerHandle | None = None
        self.opened = 0  # connections made (for tests)

    async def request(self, request: httpx.Request, body: bytes) -> Answer:
        """Send ``request`` (whose body is ``body``) and read its answer whole."""
        head = _head(request)
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        read = timeouts.get("read")
        url = request.url
        key = (url.raw_host.decode("ascii"), url.port or 80)
        retry = request.method in IDEMPOTENT
        while True:
            conn = await self._acquire(key, timeouts)
            try:
                if conn.transport is None or conn.transport.is_closing():
                    raise _Lost()
                conn.transport.write(head + body if body else head)
                answer, reuse = await _read_answer(conn, request.method, read)
            except _Lost:
                self._discard(conn)
                if retry:
                    retry = False
                    continue
                raise httpx.RemoteProtocolError(
                    "Server disconnected without sending a response.") from None
            except BaseException:
                self._discard(conn)
                raise
            if reuse and not conn.buffer and not conn.closed:
                self._release(key, conn)
            else:
                self._discard(conn)
            return answer

    async def _acquire(self, key: tuple[str, int], timeouts: dict[str, Any]) -> _Connection:
        """An idle connection to ``key``, else a new one once the pool has room (waiting at
        most the pool timeout: PoolTimeout), connected within the connect timeout."""
        loop = asyncio.get_running_loop()
        conn = self._idle_one(key, loop.time())
        if conn is not None:
            return conn
        if self._open >= self.limit and not self._close_an_idle():
            try:
                async with asyncio.timeout(timeouts.get("pool")):
                    while True:
                        waiter = loop.create_future()
                        self._waiters.append(waiter)
                        try:
                            await waiter
                        finally:
                            self._waiters.remove(waiter)
                        conn = self._idle_one(key, loop.time())
                        if conn is not None:
                            return conn
                        if self._open < self.limit or self._close_an_idle():
                            break
            except TimeoutError:
                raise httpx.PoolTimeout("no free connection within the pool timeout") from None
        self._open += 1
        try:
            async with asyncio.timeout(timeouts.get("connect")):
                _, conn = await loop.create_connection(lambda: _Connection(loop), *key)
        except TimeoutError:
            self._closed_one()
            raise httpx.ConnectTimeout(f"connecting to {key[0]}:{key[1]} timed out") from None
        except OSError as exc:
            self._closed_one()
            raise httpx.ConnectError(f"cannot connect to {key[0]}:{key[1]}: {exc}") from exc
        except BaseException:
            self._closed_one()
            raise
        self.opened += 1
        return conn

    def _idle_one(self, key: tuple[str, int], now: float) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()  # the most recently used
            if conn.closed or conn.buffer or now - conn.idle_since > self.keepalive_s:
                self._discard(conn)
                continue
            return conn
        return None

    def _close_an_idle(self) -> bool:
        for conns in self._idle.values():
            if conns:
                self._discard(conns.pop(0))  # the least recently used
                return True
        return False

    def _release(self, key: tuple[str, int], conn: _Connection) -> None:
        loop = asyncio.get_running_loop()
        conn.idle_since = loop.time()
        self._idle.setdefault(key, []).append(conn)
        if self._sweep is None:
            self._sweep = loop.call_later(self.keepalive_s, self._expire)
        self._wake_one()

    def _discard(self, conn: _Connection) -> None:
        conn.close()
        self._closed_one()

    def _closed_one(self) -> None:
        self._open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
                return

    def _expire(self) -> None:
        self._sweep = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for key, conns in list(self._idle.items()):
            keep = []
            for conn in conns:
                if conn.closed or now - conn.idle_since > self.keepalive_s:
                    self._discard(conn)
                else:
                    keep.append(conn)
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]
        if self._idle:
            self._sweep = loop.call_later(self.keepalive_s, self._expire)

    def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for conns in self._idle.values():
            for conn in conns:
                self._discard(conn)
        self._idle.clear()


def eligible(request: httpx.Request) -> bytes | None:
    """The body when :class:`Http1Pool` may send ``request``; None for aiohttp."""
    if request.url.scheme != "http" or request.method == "CONNECT":
        return None
    try:
        body = request.content
    except httpx.RequestNotRead:
        return None
    for _, name, _ in request.headers._list:  # lower-cased names
        if name == b"expect" or name == b"upgrade":
            return None
    return body


def _head(request: httpx.Request) -> bytes:
    method = request.method.encode("ascii")
    target = request.url.raw_path
    lines = [b"%s %s HTTP/1.1\r\n" % (method, target)]
    lines += [b"%s: %s\r\n" % item for item in request.headers.raw]
    lines.append(b"\r\n")
    head = b"".join(lines)
    if head.count(b"\n") != len(lines) or head.count(b"\r") != len(lines) or b"\0" in head \
            or b" " in target or not _TOKEN.match(method):
        raise httpx.LocalProtocolError("a header, the method or the target holds a control "
                                       "character")
    return head


async def _read_answer(conn: _Connection, method: str, read: float | None
                       ) -> tuple[Answer, bool]:
    """The answer, and whether the connection may serve another request."""
    while True:
        if not conn.buffer and conn.closed:
            raise _Lost()
        try:
            head = await conn.until(b"\r\n\r\n", MAX_HEAD, read, "the response head")
        except httpx.RemoteProtocolError:
            if not conn.buffer and conn.closed:
                raise _Lost() from None
            raise
        except httpx.ReadError:
            raise _Lost() from None
        version, status, reason, headers = _parse_head(head)
        if 100 <= status < 200:
            if status == 101:
                raise httpx.RemoteProtocolError("the server switched protocols")
            continue  # an interim answer (100 Continue, 103 Early Hints): the next one
        break
    names = [name.lower() for name, _ in headers]
    reuse = version == b"HTTP/1.1" and not _has_token(headers, names, b"connection", b"close")
    if method == "HEAD" or status in (204, 304):
        return Answer(status, reason, version, headers, b""), reuse
    if b"transfer-encoding" in names:
        if not _has_token(headers, names, b"transfer-encoding", b"chunked"):
            return Answer(status, reason, version, headers, await conn.rest(read)), False
        return Answer(status, reason, version, headers, await _chunked(conn, read)), reuse
    if b"content-length" in names:
        lengths = {value.strip() for name, (_, value) in zip(names, headers, strict=True)
                   if name == b"content-length"}
        if len(lengths) != 1 or not next(iter(lengths)).isdigit():
            raise httpx.RemoteProtocolError("invalid Content-Length")
        body = await conn.exactly(int(next(iter(lengths))), read)
        return Answer(status, reason, version, headers, body), reuse
    return Answer(status, reason, version, headers, await conn.rest(read)), False


def _parse_head(head: bytes) -> tuple[bytes, int, bytes, list[tuple[bytes, bytes]]]:
    lines = head.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:100]!r}")
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name.strip() != name or line[:1] in (b" ", b"\t"):
            raise httpx.RemoteProtocolError(f"malformed header line {line[:100]!r}")
        headers.append((name, value.strip(b" \t")))
    return version, int(code), reason, headers


def _has_token(headers: list[tuple[bytes, bytes]], names: list[bytes], name: bytes,
               token: bytes) -> bool:
    return any(n == name and token in [t.strip().lower() for t in v.split(b",")]
               for n, (_, v) in zip(names, headers, strict=True))


_HEX_DIGITS = b"0123456789abcdefABCDEF"


async def _chunked(conn: _Connection, read: float | None) -> bytes:
    parts: list[bytes] = []
    while True:
        line = await conn.until(b"\r\n", 1024, read, "a chunk size")
        size_text = line.split(b";", 1)[0].strip()
        # Hex digits only: int(x, 16) would also take "0x", "_", a sign or inner spaces.
        if not 0 < len(size_text) <= 16 or size_text.strip(_HEX_DIGITS):
            raise httpx.RemoteProtocolError(f"malformed chunk size {line[:40]!r}")
        size = int(size_text, 16)
        if size == 0:
            while await conn.until(b"\r\n", MAX_HEAD, read, "the trailers"):
                pass
            return b"".join(parts)
        parts.append(await conn.exactly(size, read))
        if await conn.exactly(2, read) != b"\r\n":
            raise httpx.RemoteProtocolError("a chunk does not end with CRLF")
