"""hands.http builds requests as httpx builds them: the same method, URL, headers (names,
values and order), body and extensions, a URL given as a string parsed once, and only the
content codings the client can bound asked for."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from baton.hands.http import ACCEPT_ENCODING, CookielessClient

CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "http://mail.test:8025/send",
     {"json": {"to": "a@b.c", "subject": "Notice", "body": "caf\u00e9"},
      "headers": {"Idempotency-Key": "op-1"}}),
    ("GET", "http://mail.test/operations/op-1", {}),
    ("get", "https://x.test/a?q=1&r=%20", {"headers": {"accept": "text/plain",
                                                       "USER-AGENT": "tool/1"}}),
    ("POST", "http://x.test/raw", {"content": b"raw bytes"}),
    ("PUT", "http://x.test/text", {"content": "some text"}),
    ("PUT", "http://x.test/empty", {"content": ""}),
    ("POST", "http://x.test/nobody", {}),
    ("PATCH", "http://x.test/j", {"json": [1, 2], "headers": {"Content-Type": "text/json"}}),
    ("POST", "http://x.test/h", {"json": {}, "headers": {"Host": "other.test",
                                                         "Content-Length": "2"}}),
    ("DELETE", "http://x.test/b", {"headers": {b"X-Bytes": b"v", "x-str": "w"}}),
    ("GET", "http://x.test/t", {"timeout": 3.0, "extensions": {"sni_hostname": "s"}}),
    ("GET", "http://x.test/t", {"extensions": {"timeout": {"connect": 1.0}}}),
    ("POST", "http://x.test/p", {"params": {"a": "1"}, "json": {"k": "v"}}),
    ("POST", "http://x.test/d", {"data": {"a": "1"}}),
    ("GET", "http://x.test/l", {"headers": [("X-Twice", "1"), ("X-Twice", "2")]}),
    ("GET", "relative/path", {"headers": {"X-A": "1"}}),
]


def _shape(request: httpx.Request) -> tuple[Any, ...]:
    return (request.method, str(request.url), request.headers.raw, request.content,
            request.extensions, request.headers.encoding, type(request.stream))


CLIENTS: list[dict[str, Any]] = [
    {}, {"headers": {"X-Client": "c", "Accept": "application/json"}},
    {"base_url": "http://base.test/api/", "timeout": httpx.Timeout(5.0, connect=1.0)},
]


@pytest.mark.parametrize(("client_kwargs", "method", "url", "kwargs"), [
    (client, *case) for client in CLIENTS for case in CASES
    if "base_url" in client or not case[1].startswith("relative")  # needs a base URL
])
async def test_requests_are_built_as_httpx_builds_them(
        client_kwargs: dict[str, Any], method: str, url: str, kwargs: dict[str, Any]) -> None:
    async with CookielessClient(**client_kwargs) as ours, \
            httpx.AsyncClient(**client_kwargs) as httpx_own:
        httpx_own.headers["Accept-Encoding"] = ACCEPT_ENCODING  # as ours asks
        for _ in range(2):  # the second time from the parsed-URL cache
            assert _shape(ours.build_request(method, url, **kwargs)) == \
                _shape(httpx_own.build_request(method, url, **kwargs))


async def test_only_the_codings_the_client_bounds_are_asked_for() -> None:
    async with CookielessClient() as ours:
        assert ours.build_request("GET", "http://x.test/").headers["accept-encoding"] == \
            "gzip, deflate"
    async with CookielessClient(headers={"accept-encoding": "identity"}) as given:
        assert given.build_request("GET", "http://x.test/").headers["accept-encoding"] == \
            "identity"


async def test_headers_httpx_refuses_are_refused_the_same_way() -> None:
    async with CookielessClient() as ours, httpx.AsyncClient() as httpx_own:
        for headers in ({"X-A": "caf\u00e9"}, {"X-A": 1}):
            with pytest.raises(Exception) as expected:
                httpx_own.build_request("GET", "http://x.test/", headers=headers)
            with pytest.raises(type(expected.value)):
                ours.build_request("GET", "http://x.test/", headers=headers)
