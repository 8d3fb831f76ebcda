"""The Hands' shared HTTP client: httpx's API over aiohttp's connection pool, bounded, keeping
no cookies.

Tools get an ``httpx.AsyncClient`` (:func:`http_client`); its transport sends each request
through one ``aiohttp.ClientSession``, both used through their public APIs only. httpcore's
pool scans every connection per request, about 5x the CPU per call at 32 calls in flight,
hence aiohttp underneath. aiohttp is imported here, when the worker builds its client before
serving: a first request must never wait for an import (it would stall the event loop, and
with it the heartbeats of the messages in hand).

One client serves every tool call of every session, so it must keep nothing one call
received for another: a cookie a server set in answer to one session's request would be
sent with the next session's requests to that server. Neither httpx's jar nor aiohttp's
keeps any here (a tool that needs a cookie passes it with its request).

The URL a request goes to is often the model's choice, so what a server may make the client
hold or wait for is bounded, by aiohttp where it has the bound:

    what a server may send              bound                               ends as
    a status or header line             8190 bytes (aiohttp)                RemoteProtocolError
    header lines, trailers included     128 (aiohttp)                       RemoteProtocolError
    a malformed head or chunking        refused by aiohttp's parser         RemoteProtocolError
    a body, as sent                     ``max_body_bytes``: by its          ResponseTooLarge
                                        Content-Length up front, else as
                                        it arrives (chunked, until close)
    a body, decoded (gzip, deflate)     ``max_body_bytes``, counted in      ResponseTooLarge
                                        64 KiB steps before httpx decodes
    slowness: a drip, an endless body,  ``deadline_s`` from the request to  RequestDeadlineExceeded
    endless 1xx answers                 the last byte (aiohttp's total)
    silence on a read, a slow connect   httpx's ``Timeout``                 ReadTimeout, ...

Interim 1xx answers are skipped by aiohttp, each bounded as a head, their number only by the
deadline. The body is read as the caller reads it (``client.stream``), aiohttp pausing the
socket while its buffer is full: nothing is buffered that the caller has not asked for, and
a whole read (``client.get``) holds at most ``max_body_bytes``. A request may set its own
bounds with the extensions ``max_body_bytes`` and ``deadline_s``
(``ctx.http.get(url, extensions={"max_body_bytes": 2**26})``).

The client asks for ``gzip, deflate`` only, the codings whose decoded size it can count in
bounded steps; a body in another coding httpx would decode (``br``, ``zstd``) is refused
with httpx's ``DecodingError``. aiohttp's errors reach tools as httpx's (connect, timeout,
protocol, read), with aiohttp's as their cause, which :func:`baton.hands.retries.classify`
reads. The bounds' own errors are :class:`~baton.errors.HttpError` subclasses (ToolErrors):
a tool that lets one escape returns it as a coded result, as it returns an httpx error it
lets escape (:func:`as_tool_error`): the method, the URL without its query, what failed.
"""

from __future__ import annotations

import http.cookiejar
import zlib
from collections.abc import AsyncIterator, Iterator
from itertools import chain
from typing import Any, NoReturn

import aiohttp
import httpx
import yarl
from aiohttp import hdrs

from baton.errors import ConfigError, HttpError, RequestDeadlineExceeded, ResponseTooLarge
from baton.hands.retries import RetryTransport

__all__ = ["CookielessClient", "CookielessTransport", "as_tool_error", "http_client"]

#: How many parsed URLs (and timeouts) a transport keeps; past it the cache starts again
#: (URLs that vary per call, e.g. with an id in the path, must not grow it without bound).
URL_CACHE_SIZE = 256
#: Idle keep-alive connections are closed after this long.
KEEPALIVE_S = 5.0
#: Connections open at most (aiohttp's default).
POOL_SIZE = 100
#: A response body's bound, as sent and once decoded (Settings.tool_http_max_bytes).
MAX_BODY_BYTES = 8 * 1024 * 1024
#: From a request to its response's last byte at most (Settings.tool_http_deadline_s).
DEADLINE_S = 30.0
#: A body up to this size (by its Content-Length, not content-encoded) is read with the
#: response's head, larger or chunked ones as the caller reads them.
SMALL_BODY = 64 * 1024
#: The bounds of a response's head (aiohttp's defaults, stated): a status or header line's
#: bytes, and header lines (trailers included), so a head holds about 1 MiB at most.
MAX_LINE_BYTES = 8190
MAX_HEADERS = 128
#: The content codings asked for: those whose decoded size is counted in bounded steps.
ACCEPT_ENCODING = "gzip, deflate"
#: Codings httpx decodes (when their library is installed) in one unbounded step: refused.
_UNBOUNDED_CODINGS = frozenset({"br", "zstd"})
#: How much a decoder may produce per step while counting a body's decoded size.
_DECODE_STEP = 64 * 1024
_NO_COOKIES = "the shared tool client keeps no cookies; pass them with the request"


class _NoCookieJar(http.cookiejar.CookieJar):
    """A cookie jar that stays empty: nothing a response sets is kept, nothing can be set."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None

    def set_cookie(self, cookie: http.cookiejar.Cookie) -> NoReturn:
        raise ConfigError(_NO_COOKIES)


class _NoCookies(httpx.Cookies):
    """The client's cookies: none, ever. A response's are not even looked at (httpx would
    build two ``urllib`` objects per response to offer them to the jar)."""

    def __init__(self) -> None:
        super().__init__(_NoCookieJar())

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


class CookielessClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` shared by many sessions: it keeps no cookies (see the module
    docstring), asks only for the content codings the transport bounds, and parses a URL it
    was given as a string before only once."""

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.pop("cookies", None):
            raise ConfigError(_NO_COOKIES)
        super().__init__(**kwargs)
        self._no_cookies = _NoCookies()
        self._urls: dict[str, httpx.URL] = {}
        if "accept-encoding" not in httpx.Headers(kwargs.get("headers")):
            self.headers["Accept-Encoding"] = ACCEPT_ENCODING

    @property
    def cookies(self) -> httpx.Cookies:
        return self._no_cookies  # httpx reads and offers responses to the client's this way

    @cookies.setter
    def cookies(self, cookies: Any) -> NoReturn:
        raise ConfigError(_NO_COOKIES)

    def build_request(self, method: str, url: httpx.URL | str, **kwargs: Any
                      ) -> httpx.Request:
        """httpx's request, the URL given as a string parsed once: a tool sending to the
        same endpoint for every call does not parse it per call (an ``httpx.URL`` never
        changes once made, and httpx takes one as it is)."""
        if isinstance(url, str):
            parsed = self._urls.get(url)
            if parsed is None:
                if len(self._urls) >= URL_CACHE_SIZE:
                    self._urls.clear()
                parsed = self._urls[url] = httpx.URL(url)
            url = parsed
        return super().build_request(method, url, **kwargs)


class CookielessTransport(httpx.AsyncBaseTransport):
    """httpx requests sent through one aiohttp session that keeps no cookies, their responses
    bounded (see the module docstring)."""

    def __init__(self, *, max_body_bytes: int = MAX_BODY_BYTES,
                 deadline_s: float = DEADLINE_S) -> None:
        self.max_body_bytes = max_body_bytes
        self.deadline_s = deadline_s
        self._session: aiohttp.ClientSession | None = None
        self._ssl = httpx.create_ssl_context()  # httpx's CA bundle; loaded now, not mid-call
        self._urls: dict[str, yarl.URL] = {}
        self._timeouts: dict[tuple[Any, ...], aiohttp.ClientTimeout] = {}

    def _open(self) -> aiohttp.ClientSession:  # in the loop: aiohttp wants one running
        connector = aiohttp.TCPConnector(keepalive_timeout=KEEPALIVE_S, ssl=self._ssl,
                                         limit=POOL_SIZE)
        self._session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,  # httpx decodes, as it does over its own transport
            max_line_size=MAX_LINE_BYTES, max_field_size=MAX_LINE_BYTES,
            max_headers=MAX_HEADERS,
        )
        return self._session

    def _url(self, url: httpx.URL) -> yarl.URL:
        text = str(url)
        parsed = self._urls.get(text)
        if parsed is None:
            parsed = yarl.URL(text, encoded=True)  # httpx sends it percent-encoded already
            if len(self._urls) >= URL_CACHE_SIZE:
                self._urls.clear()
            self._urls[text] = parsed
        return parsed

    def _timeout(self, timeout: dict[str, float | None], deadline_s: float
                 ) -> aiohttp.ClientTimeout:
        key = (timeout.get("connect"), timeout.get("read"), timeout.get("pool"), deadline_s)
        found = self._timeouts.get(key)
        if found is None:
            if len(self._timeouts) >= URL_CACHE_SIZE:
                self._timeouts.clear()
            # total: aiohttp's one timer from the request to the body's last byte
            found = self._timeouts[key] = aiohttp.ClientTimeout(
                total=deadline_s, sock_connect=key[0], sock_read=key[1], connect=key[2])
        return found

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        extensions = request.extensions
        limit: int = extensions.get("max_body_bytes", self.max_body_bytes)
        deadline_s: float = extensions.get("deadline_s", self.deadline_s)
        session = self._session or self._open()
        data: bytes | httpx.AsyncByteStream | None
        try:
            data = request.content or None
        except httpx.RequestNotRead:
            data = request.stream  # type: ignore[assignment]
            request.headers.pop("transfer-encoding", None)  # aiohttp chunks it
        try:
            response = await session.request(
                request.method, self._url(request.url), headers=_aiohttp_headers(request.headers),
                data=data, allow_redirects=False, compress=False,
                timeout=self._timeout(extensions.get("timeout", {}), deadline_s),
                server_hostname=extensions.get("sni_hostname"),
            )
        except aiohttp.ClientError as exc:
            raise _httpx_error(exc) from exc
        except TimeoutError:  # aiohttp's total timeout; its others are ClientErrors
            raise RequestDeadlineExceeded(request.method, _shown(request.url),
                                          deadline_s) from None
        except ValueError as exc:  # a header or method aiohttp will not send (CR, LF...)
            raise httpx.LocalProtocolError(str(exc)) from exc
        body: httpx.AsyncByteStream
        try:
            body = _Body(request, response, limit, deadline_s)
            length = response.content_length
            if body.decoded is None and length is not None and length <= SMALL_BODY:
                # Read with the head: one read, the connection back in the pool at once,
                # and none of a stream's machinery per chunk.
                body = httpx.ByteStream(await response.read())
        except aiohttp.ClientError as exc:
            response.close()
            raise _httpx_error(exc) from exc
        except TimeoutError:
            response.close()
            raise RequestDeadlineExceeded(request.method, _shown(request.url),
                                          deadline_s) from None
        except BaseException:
            response.close()
            raise
        version = response.version or aiohttp.HttpVersion11
        answer: dict[str, Any] = {"http_version": b"HTTP/%d.%d" % (version.major, version.minor)}
        if response.reason:  # else httpx gives the status's usual phrase
            answer["reason_phrase"] = response.reason.encode("utf-8", "replace")
        return httpx.Response(status_code=response.status, headers=response.raw_headers,
                              stream=body, request=request, extensions=answer)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class _Body(httpx.AsyncByteStream):
    """A response body as the caller reads it, within its bounds: the bytes as sent, and
    their decoded size counted before httpx decodes them."""

    def __init__(self, request: httpx.Request, response: aiohttp.ClientResponse, limit: int,
                 deadline_s: float) -> None:
        self._request = request
        self._response = response
        self._limit = limit
        self._deadline_s = deadline_s
        codings = [coding.strip().lower()
                   for value in response.headers.getall(hdrs.CONTENT_ENCODING, ())
                   for coding in value.split(",")]
        unbounded = _UNBOUNDED_CODINGS.intersection(codings)
        if unbounded:
            raise httpx.DecodingError(
                f"the body is {', '.join(sorted(unbounded))}-encoded, which the client did "
                f"not ask for (Accept-Encoding: {ACCEPT_ENCODING}) and cannot decode within "
                f"a bound", request=request)
        self.decoded = _DecodedSize(codings, request, limit) \
            if "gzip" in codings or "deflate" in codings else None
        length = response.content_length
        if length is not None and length > limit and request.method != "HEAD" \
                and response.status not in (204, 304):
            raise self._too_large(decoded=False)

    def _too_large(self, *, decoded: bool) -> ResponseTooLarge:
        return ResponseTooLarge(self._request.method, _shown(self._request.url), self._limit,
                                decoded=decoded)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        received = 0
        chunks = self._response.content.iter_any()
        while True:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except aiohttp.ClientError as exc:
                raise _httpx_error(exc) from exc
            except TimeoutError:  # aiohttp's total timeout
                raise RequestDeadlineExceeded(self._request.method, _shown(self._request.url),
                                              self._deadline_s) from None
            received += len(chunk)
            if received > self._limit:
                self._response.close()  # the rest is never read: the connection goes
                raise self._too_large(decoded=False)
            if self.decoded is not None:
                self.decoded.count(chunk)
            yield chunk

    async def aclose(self) -> None:
        self._response.release()  # back to the pool when read whole, else closed


class _DecodedSize:
    """How many bytes httpx will decode from a body, counted as it arrives in steps of at
    most ``_DECODE_STEP`` output bytes: ResponseTooLarge before a chunk that would take the
    decoded body past the limit is handed to httpx. Decodes as httpx's decoders do (several
    codings in reverse order; deflate zlib-wrapped, else raw; gzip's first member)."""

    def __init__(self, codings: list[str], request: httpx.Request, limit: int) -> None:
        self._stages = [_Inflate(coding) for coding in reversed(codings)
                        if coding in ("gzip", "deflate")]
        self._request = request
        self._limit = limit
        self.size = 0

    def count(self, data: bytes) -> None:
        try:
            self._feed(0, data)
        except zlib.error as exc:
            raise httpx.DecodingError(str(exc), request=self._request) from exc

    def _feed(self, stage: int, data: bytes) -> None:
        if stage == len(self._stages):
            self.size += len(data)
            if self.size > self._limit:
                raise ResponseTooLarge(self._request.method, _shown(self._request.url),
                                       self._limit, decoded=True)
            return
        for piece in self._stages[stage].pieces(data):
            self._feed(stage + 1, piece)


class _Inflate:
    """One gzip or deflate decoder whose output comes in pieces of at most _DECODE_STEP."""

    def __init__(self, coding: str) -> None:
        self._deflate = coding == "deflate"
        self._first = True
        self._zlib = zlib.decompressobj(zlib.MAX_WBITS | 16 if coding == "gzip"
                                        else zlib.MAX_WBITS)

    def pieces(self, data: bytes) -> Iterator[bytes]:
        while True:
            try:
                piece = self._zlib.decompress(data, _DECODE_STEP)
            except zlib.error:
                if not (self._deflate and self._first):
                    raise
                self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate, as httpx
                self._first = False
                continue
            self._first = False
            data = self._zlib.unconsumed_tail
            if piece:
                yield piece
            elif not data:
                return


def _httpx_error(exc: aiohttp.ClientError) -> httpx.TransportError:
    """httpx's error for aiohttp's, by what it says about the request (raised from it)."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(text)
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return httpx.ReadTimeout(text)
    if isinstance(exc, aiohttp.ClientConnectorError):  # refused, name, TLS: never sent
        return httpx.ConnectError(text)
    if isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        return httpx.UnsupportedProtocol(text)
    if isinstance(exc, aiohttp.ClientOSError | aiohttp.ClientConnectionResetError):
        return httpx.ReadError(text)
    # the server closed or broke the protocol: a malformed or oversized head, bad chunking,
    # a body cut short
    return httpx.RemoteProtocolError(text)


def _shown(url: httpx.URL) -> str:
    """A URL as errors show it: without its query (it may hold a token) or credentials."""
    return f"{url.scheme}://{url.netloc.decode('ascii', 'replace')}{url.path}"


def as_tool_error(exc: httpx.HTTPError) -> HttpError:
    """An httpx error as the tool result the model reads: method, URL and what failed."""
    if isinstance(exc, HttpError):
        return exc
    try:
        request: httpx.Request | None = exc.request
    except RuntimeError:  # raised without a request
        request = None
    method, url = (request.method, _shown(request.url)) if request is not None else ("", "")
    return HttpError(method, url, type(exc).__name__, str(exc))


def _aiohttp_headers(headers: httpx.Headers) -> list[tuple[str, str]]:
    """The request's headers as aiohttp takes them: every item as sent (a repeated name
    stays repeated), decoded once with the encoding httpx encoded them with."""
    raw = headers.raw
    encoding = "ascii" if all(map(bytes.isascii, chain.from_iterable(raw))) \
        else headers.encoding
    return [(k.decode(encoding), v.decode(encoding)) for k, v in raw]


def http_client(connect_timeout_s: float, *, max_body_bytes: int = MAX_BODY_BYTES,
                deadline_s: float = DEADLINE_S, **kwargs: Any) -> httpx.AsyncClient:
    """The client tools get as ``ctx.http``: re-sends only what provably never left, keeps
    no cookies, bounds what a response may make it hold or wait for. The plain-loop baseline
    of the benchmarks sends through the same one."""
    return CookielessClient(
        timeout=httpx.Timeout(30.0, connect=connect_timeout_s),
        transport=RetryTransport(CookielessTransport(max_body_bytes=max_body_bytes,
                                                     deadline_s=deadline_s)), **kwargs,
    )
