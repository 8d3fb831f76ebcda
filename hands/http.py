"""The Hands' shared HTTP client: httpx's API over aiohttp's connection pool, keeping no cookies.

httpcore's pool scans every connection per request, about 5x the CPU per call at 32 calls
in flight, hence aiohttp underneath. A plain-http request whose whole answer is wanted (not
``client.stream``; a body in memory) goes through a leaner HTTP/1.1 client of its own
(:mod:`baton.hands.http1`), at about half aiohttp's CPU per call; the rest (https, streams)
through aiohttp. Between httpx and either, the layers are kept thin: the common request
shapes are built in one pass, httpx's no-op authentication flow is skipped, response
headers are built from raw bytes and a small body is read whole. aiohttp is imported here,
when the worker builds its client before serving: a first request must never wait for an
import (it would stall the event loop, and with it the heartbeats of the messages in hand).

One client serves every tool call of every session, so it must keep nothing one call
received for another: a cookie a server set in answer to one session's request would be
sent with the next session's requests to that server. Neither httpx's jar nor aiohttp's
keeps any here (a tool that needs a cookie passes it with its request). The parsed form of
the URLs tools send to is kept (a few hundred at most): a tool sending to the same endpoint
for every call parses it once, not twice per request.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Sequence
from itertools import chain
from typing import Any, NoReturn

import aiohttp
import httpx
import yarl
from aiohttp import hdrs
from httpx._client import ClientState, UseClientDefault
from httpx._content import encode_request
from httpx_aiohttp.transport import AiohttpResponseStream, map_aiohttp_exceptions

from baton.errors import ConfigError
from baton.hands.http1 import Answer, Http1Pool, eligible
from baton.hands.retries import RetryTransport

__all__ = ["CookielessClient", "CookielessTransport", "http_client"]

#: How many parsed URLs a client keeps; past it the cache starts again (URLs that vary per
#: call, e.g. with an id in the path, must not grow it without bound).
URL_CACHE_SIZE = 256
#: Idle keep-alive connections are closed after this long.
KEEPALIVE_S = 5.0
#: Connections open at most, by each of the two clients (aiohttp's default).
POOL_SIZE = 100
#: Whether the request being sent wants its whole answer (not ``client.stream``).
_WHOLE: contextvars.ContextVar[bool] = contextvars.ContextVar("baton_http_whole",
                                                              default=False)
#: A response body up to this size (by its Content-Length, not content-encoded) is read
#: whole with the response head: one read instead of httpx's chunk iterators. Larger or
#: chunked bodies stream as they arrive.
SMALL_BODY = 64 * 1024
_NO_COOKIES = "the shared tool client keeps no cookies; pass them with the request"


class _NoCookies(httpx.Cookies):
    """A cookie store that stays empty: nothing a response sets is kept."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None

    def set(self, name: str, value: str, domain: str = "", path: str = "/") -> NoReturn:
        raise ConfigError(_NO_COOKIES)

    def __setitem__(self, name: str, value: str) -> NoReturn:
        raise ConfigError(_NO_COOKIES)

    def update(self, cookies: Any = None) -> NoReturn:  # type: ignore[override]
        raise ConfigError(_NO_COOKIES)


class CookielessClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` shared by many sessions: it keeps no cookies (see the module
    docstring) and parses a URL it sent to before only once."""

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("cookies"):
            raise ConfigError(_NO_COOKIES)
        super().__init__(**kwargs)
        self._cookies = _NoCookies()
        self._urls: dict[str, httpx.URL] = {}
        self._urls_base = self._base_url

    @property
    def cookies(self) -> httpx.Cookies:
        return self._cookies

    @cookies.setter
    def cookies(self, cookies: Any) -> NoReturn:
        raise ConfigError(_NO_COOKIES)

    async def send(
        self, request: httpx.Request, *, stream: bool = False,
        auth: Any = httpx.USE_CLIENT_DEFAULT, follow_redirects: Any = httpx.USE_CLIENT_DEFAULT,
    ) -> httpx.Response:
        """httpx's ``send``, without its authentication flow when there is none to run (no
        auth on the client or the request, no credentials in the URL, no event hooks):
        httpx would run its no-op flow, an async generator resumed per request. Such a
        request tells the transport whether its whole answer is wanted (not ``stream``):
        then a plain-http one may go through the lean client (hands.http1); any other
        request goes through aiohttp."""
        hooks = self.event_hooks
        if not isinstance(auth, UseClientDefault) or self.auth is not None \
                or request.url.userinfo or hooks["request"] or hooks["response"]:
            return await super().send(request, stream=stream, auth=auth,
                                      follow_redirects=follow_redirects)
        if self.is_closed:
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        self._state = ClientState.OPENED
        follow = self.follow_redirects if isinstance(follow_redirects, UseClientDefault) \
            else follow_redirects
        self._set_timeout(request)
        token = _WHOLE.set(not stream)  # a whole answer may be read by the lean client
        try:
            response = await self._send_handling_redirects(request, follow_redirects=follow,
                                                           history=[])
        finally:
            _WHOLE.reset(token)
        try:
            if not stream:
                await response.aread()
        except BaseException:
            await response.aclose()
            raise
        return response

    def build_request(  # type: ignore[override]
        self, method: str, url: httpx.URL | str, *, content: Any = None, data: Any = None,
        files: Any = None, json: Any = None, params: Any = None, headers: Any = None,
        cookies: Any = None, timeout: Any = httpx.USE_CLIENT_DEFAULT,
        extensions: Any = None,
    ) -> httpx.Request:
        """httpx's request, built in one pass over bytes for the common shape (a URL, a
        bytes, str or JSON body, a mapping of headers): the same method, URL, headers in the
        same order, body and extensions as httpx builds them, without httpx's three rounds
        of header normalisation. Any other shape is built by httpx itself."""
        request = None
        if data is None and files is None and params is None and cookies is None \
                and not self.params and isinstance(content, bytes | str | None) \
                and (headers is None or isinstance(headers, dict)):
            request = self._build_plain(method, url, content, json, headers, timeout,
                                        extensions)
        if request is None:
            return super().build_request(
                method, url, content=content, data=data, files=files, json=json,
                params=params, headers=headers, cookies=cookies, timeout=timeout,
                extensions=extensions)
        return request

    def _build_plain(
        self, method: str, url: httpx.URL | str, content: bytes | str | None, json: Any,
        headers: dict[Any, Any] | None, timeout: Any, extensions: Any,
    ) -> httpx.Request | None:
        try:
            given = [(_ascii(k), _ascii(k).lower(), _ascii(v)) for k, v in headers.items()] \
                if headers else []
        except (TypeError, UnicodeEncodeError):
            return None  # httpx raises its own error for these
        merged_url = self._merge_url(url)
        extensions = {} if extensions is None else extensions
        if "timeout" not in extensions:
            timeout = self.timeout if isinstance(timeout, UseClientDefault) \
                else httpx.Timeout(timeout)
            extensions = dict(**extensions, timeout=timeout.as_dict())
        # The client's headers, those given replacing any of the same name (Headers.update)
        replaced = {lower for _, lower, _ in given}
        items = [item for item in self.headers._list if item[1] not in replaced]
        items += given
        # The body's headers where none of the name was given (Request._prepare)
        defaults, stream = encode_request(content=content, json=json)
        present = {lower for _, lower, _ in items}
        for key, value in defaults.items():
            lower = key.lower().encode()
            if lower not in present:
                items.append((key.encode(), lower, value.encode()))
                present.add(lower)
        request = httpx.Request(method, merged_url, stream=stream, extensions=extensions)
        auto: list[tuple[bytes, bytes, bytes]] = []
        if b"host" not in present and request.url.host:
            auto.append((b"Host", b"host", request.url.netloc))
        if b"content-length" not in present and b"transfer-encoding" not in present \
                and request.method in ("POST", "PUT", "PATCH"):
            auto.append((b"Content-Length", b"content-length", b"0"))
        built = httpx.Headers()
        built._list = auto + items
        request.headers = built
        request.read()
        return request

    def _merge_url(self, url: httpx.URL | str) -> httpx.URL:
        if not isinstance(url, str):
            return super()._merge_url(url)
        if self._urls_base is not self._base_url:  # base_url was set: merged URLs differ
            self._urls.clear()
            self._urls_base = self._base_url
        merged = self._urls.get(url)
        if merged is None:
            merged = super()._merge_url(url)  # an httpx.URL never changes once made
            if len(self._urls) >= URL_CACHE_SIZE:
                self._urls.clear()
            self._urls[url] = merged
        return merged


class CookielessTransport(httpx.AsyncBaseTransport):
    """httpx requests sent through one aiohttp session that keeps no cookies; a plain-http
    request whose whole answer is wanted through the lean client (hands.http1) instead."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._http1 = Http1Pool(limit=POOL_SIZE, keepalive_s=KEEPALIVE_S)
        self._ssl = httpx.create_ssl_context()  # httpx's CA bundle; loaded now, not mid-call
        self._urls: dict[str, yarl.URL] = {}
        self._timeouts: dict[tuple[Any, ...], aiohttp.ClientTimeout] = {}

    def _open(self) -> aiohttp.ClientSession:  # in the loop: aiohttp wants one running
        # aiohttp's default pool size (100 connections)
        connector = aiohttp.TCPConnector(keepalive_timeout=KEEPALIVE_S, ssl=self._ssl,
                                         limit=POOL_SIZE)
        self._session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
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

    def _timeout(self, timeout: dict[str, float | None]) -> aiohttp.ClientTimeout:
        key = (timeout.get("connect"), timeout.get("read"), timeout.get("pool"))
        found = self._timeouts.get(key)
        if found is None:
            if len(self._timeouts) >= URL_CACHE_SIZE:
                self._timeouts.clear()
            found = self._timeouts[key] = aiohttp.ClientTimeout(
                sock_connect=key[0], sock_read=key[1], connect=key[2])
        return found

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if _WHOLE.get():
            body = eligible(request)
            if body is not None:
                return _answered(request, await self._http1.request(request, body))
        session = self._session or self._open()
        with map_aiohttp_exceptions():
            data: bytes | httpx.AsyncByteStream | None
            try:
                data = request.content or None
            except httpx.RequestNotRead:
                data = request.stream  # type: ignore[assignment]
                request.headers.pop("transfer-encoding", None)  # aiohttp chunks it
            response = await session.request(
                request.method, self._url(request.url), headers=_aiohttp_headers(request.headers),
                data=data, allow_redirects=False, compress=False,
                timeout=self._timeout(request.extensions.get("timeout", {})),
                server_hostname=request.extensions.get("sni_hostname"),
            ).__aenter__()
            body = None
            length = response.content_length
            if length is not None and length <= SMALL_BODY \
                    and hdrs.CONTENT_ENCODING not in response.headers:
                body = await response.read()  # one read, the connection goes back to the pool
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode()
        answer: httpx.Response
        if body is None:
            answer = httpx.Response(status_code=response.status,
                                    stream=AiohttpResponseStream(response), request=request,
                                    extensions=extensions)
        else:
            answer = _ReadResponse(status_code=response.status,
                                   stream=_ReadBody(body, response), request=request,
                                   extensions=extensions)
            answer.body = body
        answer.headers = _httpx_headers(response.raw_headers)  # not copied: keeps its encoding
        return answer

    async def aclose(self) -> None:
        self._http1.close()
        if self._session is not None:
            await self._session.close()


def _answered(request: httpx.Request, answer: Answer) -> httpx.Response:
    """httpx's response to an answer the lean client read whole."""
    extensions: dict[str, Any] = {"http_version": answer.version}
    if answer.reason:
        extensions["reason_phrase"] = answer.reason
    response = _ReadResponse(status_code=answer.status, stream=_ReadBody(answer.body),
                             request=request, extensions=extensions)
    headers = response.headers = _httpx_headers(answer.headers)
    if "content-encoding" not in headers:  # else httpx decodes it as it reads the stream
        response.body = answer.body
    return response


class _ReadBody(httpx.AsyncByteStream):
    """A body the transport read whole: one chunk, then the response is released."""

    def __init__(self, body: bytes, response: aiohttp.ClientResponse | None = None) -> None:
        self._body = body
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._body:
            yield self._body

    async def aclose(self) -> None:
        if self._response is not None:
            self._response.release()


class _ReadResponse(httpx.Response):
    """A response whose (small, unencoded) body the transport read whole: ``aread`` takes
    it as it is instead of passing it through httpx's chunk iterators and decoders, with
    the same effects (content set, stream consumed and closed, ``elapsed`` known)."""

    body: bytes | None = None

    async def aread(self) -> bytes:
        body = self.body
        if body is None or hasattr(self, "_content") or self.is_stream_consumed \
                or self.is_closed:
            return await super().aread()
        self.body = None
        self.is_stream_consumed = True
        self._num_bytes_downloaded = len(body)
        self._content = body
        await self.aclose()
        return body


def _ascii(text: str | bytes) -> bytes:
    """A header name or value as httpx normalises a given one (``_normalize_header_*``)."""
    if isinstance(text, bytes):
        return text
    if not isinstance(text, str):
        raise TypeError(type(text))
    return text.encode("ascii")


def _aiohttp_headers(headers: httpx.Headers) -> list[tuple[str, str]]:
    """The request's headers as aiohttp takes them: every item as sent (a repeated name
    stays repeated), decoded once with the encoding httpx encoded them with."""
    raw = headers.raw
    encoding = "ascii" if all(map(bytes.isascii, chain.from_iterable(raw))) \
        else headers.encoding
    return [(k.decode(encoding), v.decode(encoding)) for k, v in raw]


def _httpx_headers(raw: Sequence[tuple[bytes, bytes]]) -> httpx.Headers:
    """httpx's Headers from aiohttp's raw (already bytes) response headers, without
    normalising every item again; ASCII headers (the common case) are marked so, sparing
    httpx the scan it makes to guess the encoding."""
    headers = httpx.Headers()
    items = [(key, key.lower(), value) for key, value in raw]
    headers._list = items
    if all(map(bytes.isascii, chain.from_iterable(raw))):
        headers.encoding = "ascii"
    return headers


def http_client(connect_timeout_s: float, **kwargs: Any) -> httpx.AsyncClient:
    """The client tools get as ``ctx.http``: re-sends only what provably never left, keeps
    no cookies. The plain-loop baseline of the benchmarks sends through the same one."""
    return CookielessClient(
        timeout=httpx.Timeout(30.0, connect=connect_timeout_s),
        transport=RetryTransport(CookielessTransport()), **kwargs,
    )
