"""Every error the API answers with is RFC 9457 problem details, never a traceback.

A :class:`~baton.errors.BatonError` keeps its code, message and fields: ``type`` is
``urn:baton:problem:<code>``, ``title`` the status phrase, ``detail`` the error's sentence,
``instance`` the request path, plus ``code``, ``retryable`` and the error's own fields. A
request that fails validation lists what was wrong (``errors``); anything unexpected is a
500 with one line and a log record, and its traceback goes to the log only.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from baton import errors
from baton.observability.log import error_text, get_logger

__all__ = ["PROBLEM_JSON", "Problem", "install", "problem_response", "status_of"]

PROBLEM_JSON = "application/problem+json"
log = get_logger("baton.api")

# The most specific class first: a subclass maps before its base.
_STATUS: tuple[tuple[type[errors.BatonError], int], ...] = (
    (errors.PayloadTooLarge, 413),
    (errors.UnauthenticatedError, 401),
    (errors.CredentialsError, 503),  # the API's own connection was refused: not the caller's
    (errors.ForbiddenError, 403),
    (errors.NotFoundError, 404),
    (errors.QuarantinedError, 409),
    (errors.CorruptStateError, 409),
    (errors.ConflictError, 409),
    (errors.FenceError, 409),
    (errors.LeaseBusyError, 409),
    (errors.ToolMismatchError, 409),
    (errors.ArchivedError, 409),  # a write to an archived session (a submission restores it)
    (errors.ValidationError, 422),
    (errors.ConfigError, 400),
    (errors.BacklogFullError, 429),  # admission at the edge: the client's to slow down
    (errors.StoreEpochError, 503),
    (errors.UnavailableError, 503),  # ArchiveUnavailable too: before ArchiveError
    (errors.ArchiveError, 502),  # the archive refused a read: the deployment's to fix
)


class Problem(BaseModel):
    """RFC 9457 problem details, with Baton's error code and whether a retry may succeed."""

    model_config = ConfigDict(extra="allow")

    type: str = "about:blank"
    title: str
    status: int
    detail: str = ""
    instance: str = ""
    code: str = ""
    retryable: bool = False


def status_of(exc: errors.BatonError) -> int:
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def problem_response(status: int, code: str, detail: str, request: Request | None = None,
                     *, retryable: bool = False, headers: dict[str, str] | None = None,
                     **extra: Any) -> JSONResponse:
    body = Problem(type=f"urn:baton:problem:{code}", title=HTTPStatus(status).phrase,
                   status=status, detail=detail,
                   instance=request.url.path if request is not None else "",
                   code=code, retryable=retryable, **extra)
    return JSONResponse(body.model_dump(), status_code=status, media_type=PROBLEM_JSON,
                        headers=headers)


def _from_baton(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, errors.BatonError)
    status = status_of(exc)
    fields = {k: v for k, v in exc.to_dict().items()
              if k not in ("code", "message", "retryable") and k not in Problem.model_fields}
    headers = {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="baton"'
    if status in (429, 503):  # how long to wait (StoreFullError, BacklogFullError)
        hint = getattr(exc, "retry_after_s", None)
        headers["Retry-After"] = str(max(1, round(hint))) if isinstance(hint, int | float) \
            else "1"
    if status == 500:
        log.error("api_error", path=request.url.path, code=exc.code, error=exc.message)
    elif status == 503:  # the store unreachable: the client retries, the operator sees it
        log.warning("api_unavailable", path=request.url.path, code=exc.code,
                    error=exc.message[:300])
    return problem_response(status, exc.code, exc.message, request, retryable=exc.retryable,
                            headers=headers, **fields)


def _from_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    found = [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")),
              "type": str(e.get("type", ""))} for e in exc.errors()]
    first = found[0] if found else {"loc": [], "msg": "invalid request"}
    where = ".".join(first["loc"])
    return problem_response(422, "invalid_request",
                            f"{where}: {first['msg']}" if where else str(first["msg"]),
                            request, errors=found)


def _from_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no such path: {request.url.path}"
    return problem_response(exc.status_code, code, detail, request,
                            headers=dict(exc.headers or {}))


def _from_other(request: Request, exc: Exception) -> JSONResponse:
    module = type(exc).__module__
    if module.startswith("redis"):
        return _from_baton(request, errors.from_redis_error(exc))
    if isinstance(exc, ConnectionError | TimeoutError):
        return _from_baton(request, errors.RedisUnavailable(f"store unreachable: {exc}"))
    log.exception("api_unexpected_error", path=request.url.path, error=error_text(exc)[:300])
    return problem_response(500, "internal", f"unexpected {type(exc).__name__} (logged by the "
                            "API; the request may be retried)", request)


class _CatchAll:
    """The outermost layer: an exception no handler took becomes a problem response (when no
    response has started) instead of an ASGI error with a traceback on the wire."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception as exc:
            if started:  # a stream broke after its first byte: all that is left is the log
                log.warning("api_stream_failed", path=scope.get("path"), error=error_text(exc))
                return
            response = _from_other(Request(scope), exc)
            await response(scope, receive, send)


class _BodyLimit:
    """Refuse a request body over ``limit`` bytes with 413, before it is read whole: a
    150 MB submission was parsed (half a gigabyte of memory) to be refused as too long."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        seen, too_large = 0, False

        async def counting() -> Message:  # a chunked body declares no length
            nonlocal seen, too_large
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:  # stop reading: to the app, the client went away
                    too_large = True
                    return {"type": "http.disconnect"}
            return message

        async def sending(message: Message) -> None:
            if not too_large:  # the app's answer to a body cut short is replaced
                await send(message)

        try:
            await self.app(scope, counting, sending)
        except Exception:
            if not too_large:
                raise
        if too_large:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        log.warning("api_body_too_large", path=scope.get("path"), limit=self.limit)
        response = problem_response(413, "payload_too_large", f"the request body is over "
                                    f"{self.limit} bytes", Request(scope))
        await response(scope, receive, send)


def install(app: FastAPI, max_body: int) -> None:
    """Answer every error with problem details; refuse bodies over ``max_body`` bytes."""
    app.add_exception_handler(errors.BatonError, _from_baton)
    app.add_exception_handler(RequestValidationError, _from_validation)
    app.add_exception_handler(HTTPException, _from_http)
    app.add_middleware(_BodyLimit, limit=max_body)
    app.add_middleware(_CatchAll)
