"""What the HTTP model clients share: the call, SSE parsing and the mapping of failures.

Failures map onto two errors (shared.errors):

* ``ModelRetryableError``: 408, 409, 429 and 5xx answers (with the server's ``Retry-After``
  or ``retry-after-ms`` hint), connection errors, timeouts (connect, between two chunks, the
  whole call) and a *truncated* stream: one that ends without its end event. A cut-off
  stream is what a dropped connection looks like, so asking again is the right answer.
* ``ModelError``: any other 4xx (bad key, unknown model, invalid request), and a *malformed*
  answer (not JSON, or not the shape the protocol defines): asking again would get the same.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson

from baton.brain.model import ModelRequest, ModelResponse, TextSink
from baton.errors import ModelError, ModelRetryableError
from baton.models import Usage
from baton.settings import Settings

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
MAX_ERROR_BODY = 2000


def retry_after(headers: httpx.Headers) -> float | None:
    """The server's hint in seconds: ``retry-after-ms``, or ``Retry-After`` (seconds or date)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_message(body: bytes) -> str:
    """The provider's own explanation from an error body, else the body's start."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:MAX_ERROR_BODY].decode(errors="replace").strip()
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict) and err.get("message"):
        kind = err.get("type") or err.get("code")
        return f"{kind}: {err['message']}" if kind else str(err["message"])
    if isinstance(err, str):
        return err
    return body[:MAX_ERROR_BODY].decode(errors="replace").strip()


def status_error(provider: str, response: httpx.Response, body: bytes) -> ModelError:
    status = response.status_code
    message = f"{provider} answered {status}: {error_message(body) or response.reason_phrase}"
    if status in RETRYABLE_STATUS:
        return ModelRetryableError(message, provider=provider, status=status,
                                   retry_after_s=retry_after(response.headers))
    return ModelError(message, provider=provider, status=status)


def transport_error(provider: str, exc: Exception) -> ModelRetryableError:
    what = {
        httpx.ConnectTimeout: "connect timed out",
        httpx.ReadTimeout: "no data within the read timeout",
        httpx.WriteTimeout: "write timed out",
        httpx.PoolTimeout: "no connection free in the pool",
        httpx.ConnectError: "cannot connect",
        httpx.RemoteProtocolError: "connection closed mid-answer",
    }.get(type(exc), "connection failed")  # type: ignore[arg-type]
    detail = str(exc)  # httpx's timeouts often carry no text: the sentence says it all
    return ModelRetryableError(f"{provider}: {what}" + (f": {detail}" if detail else ""),
                               provider=provider)


def malformed(provider: str, what: str) -> ModelError:
    return ModelError(f"{provider} sent a malformed answer: {what}", provider=provider)


def truncated(provider: str, what: str, usage: Usage | None = None) -> ModelRetryableError:
    """A stream cut before its end event; ``usage`` is what it had reported so far."""
    return ModelRetryableError(f"{provider} stream was truncated: {what}", provider=provider,
                               usage=usage)


def parse_json(provider: str, data: bytes | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise malformed(provider, f"invalid JSON ({exc})") from None


async def sse_events(provider: str, response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """``(event, data)`` of each Server-Sent Event (the default event name is "message")."""
    event, data = "", list[str]()
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield event or "message", "\n".join(data)
            event, data = "", list[str]()
            continue
        if line.startswith(":"):
            continue  # a comment (keep-alive)
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name not in ("id", "retry"):
            raise malformed(provider, f"unexpected SSE line {line[:80]!r}")
    if data:  # a last event without its blank line: the stream was cut
        yield event or "message", "\n".join(data)


def json_object(provider: str, data: str) -> dict[str, Any]:
    value = parse_json(provider, data)
    if not isinstance(value, dict):
        raise malformed(provider, "an event is not a JSON object")
    return value


def idempotency_key(request: ModelRequest, body: bytes) -> str:
    """The key of a logical request: the same on every attempt that sends the same body.

    ``<task id>:<turn>:<digest of the body>``: a retry after a 429, a 5xx, a timeout or a
    dropped connection re-sends the same bytes under the same key, so a provider that
    deduplicates can answer it from the first attempt instead of generating (and billing)
    again. When the body changed (an ``interrupted`` entry was added, the conversation grew)
    it is another request, and a provider must not answer it with the old one: the digest
    makes that a new key.
    """
    digest = hashlib.sha256(body).hexdigest()[:16]
    return f"{request.logical_id or request.request_id}:{digest}"


class HttpModel:
    """A model client over one pooled ``httpx.AsyncClient``; subclasses speak the protocol."""

    provider = "model"
    path = ""

    def __init__(self, model: str, settings: Settings, base_url: str) -> None:
        self.model = model
        self.settings = settings
        self.base_url = base_url.rstrip("/")
        s = settings
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=s.model_connect_timeout_s, read=s.model_read_timeout_s,
                                  write=s.model_read_timeout_s, pool=s.model_connect_timeout_s),
            headers={"user-agent": "baton"},
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    def headers(self, request: ModelRequest) -> dict[str, str]:
        raise NotImplementedError

    def body(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        raise NotImplementedError

    def answer(self, data: dict[str, Any]) -> ModelResponse:
        raise NotImplementedError

    async def read_stream(
        self, events: AsyncIterator[tuple[str, str]], on_text: TextSink | None
    ) -> ModelResponse:
        raise NotImplementedError

    async def generate(
        self, request: ModelRequest, on_text: TextSink | None = None
    ) -> ModelResponse:
        """One attempt: the answer, or ModelError / ModelRetryableError."""
        stream = self.settings.model_stream
        try:
            async with asyncio.timeout(self.settings.model_call_timeout_s):
                return await self._call(request, stream, on_text)
        except TimeoutError:
            raise ModelRetryableError(
                f"{self.provider}: no complete answer within "
                f"{self.settings.model_call_timeout_s:g}s", provider=self.provider) from None
        except httpx.TransportError as exc:
            raise transport_error(self.provider, exc) from None

    async def _call(
        self, request: ModelRequest, stream: bool, on_text: TextSink | None
    ) -> ModelResponse:
        body = orjson.dumps(self.body(request, stream))
        headers = {"content-type": "application/json",
                   "Idempotency-Key": idempotency_key(request, body),
                   "X-Client-Request-Id": request.request_id, **self.headers(request)}
        req = self.http.build_request("POST", self.base_url + self.path, content=body,
                                      headers=headers)
        response = await self.http.send(req, stream=True)
        try:
            if response.status_code != 200:
                raise status_error(self.provider, response, await response.aread())
            rid = response.headers.get("x-request-id") or response.headers.get("request-id") or ""
            kind = response.headers.get("content-type", "")
            if stream and kind.startswith("text/event-stream"):
                answer = await self.read_stream(sse_events(self.provider, response), on_text)
            else:
                data = parse_json(self.provider, await response.aread())
                if not isinstance(data, dict):
                    raise malformed(self.provider, "the answer is not a JSON object")
                answer = self.answer(data)
        finally:
            await response.aclose()
        return answer.model_copy(update={"provider_request_id": rid}) if rid else answer


def arguments(provider: str, raw: str | dict[str, Any] | None) -> dict[str, Any]:
    """A tool call's arguments from their JSON text (or object)."""
    if isinstance(raw, dict):
        return raw
    if not raw:
        return {}
    value = parse_json(provider, raw)
    if not isinstance(value, dict):
        raise malformed(provider, "tool call arguments are not a JSON object")
    return value
