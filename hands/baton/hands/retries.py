"""Transient tool failures: which errors are retried, and the retry loops.

A failure is only final when it may have acted. Three kinds, by what the error proves:

    kind        proves                                   what happens
    never_sent  the request never left this process:      the request is re-sent with backoff
                connect refused / timed out, name           until the tool's deadline, whatever
                resolution failed, no pooled connection     the replay policy (nothing happened)
    ambiguous   the request may have arrived: a read      a ``confirm`` tool asks the outside
                timeout, a reset or close after sending,    system first, a ``safe`` tool runs
                the request's deadline passing              again; an ``unsafe`` tool's error
                                                            is final (the model decides)
    declared    the tool said so: ``@tool(retry_on=...)``  retried like never_sent
    final       anything else                              the error is the run's result

Two places retry. :class:`RetryTransport` wraps the Hands' shared HTTP transport
(``ToolContext.http``) and re-sends one *request* that never left: the right grain, since a
tool that made two calls and failed to connect for the second must not repeat the first.
:func:`call_with_retries` re-runs the whole *tool* for a declared error, and after an
ambiguous one for ``confirm`` (confirm first) and ``safe`` tools. Both wait with jittered
exponential backoff, and only while the backoff ends before the run's deadline (a context
variable set per run by :func:`call_with_retries`); the tool's own timeout still bounds all.

A stalled process is the case this exists for: a Hands paused (or starved of CPU) past the
connect timeout resumes to a ``ConnectTimeout`` although nothing was sent; recording that as
the run's result would lose the mail for good.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import httpx

from baton.errors import RequestDeadlineExceeded, ResponseTooLarge
from baton.observability.log import get_logger

log = get_logger("baton.hands")

Kind = Literal["never_sent", "ambiguous", "declared", "final"]

#: First backoff and its cap, in seconds; each wait is a random fraction of the current
#: bound (full jitter), so workers resumed together do not retry in step.
BACKOFF_S = 0.05
BACKOFF_MAX_S = 2.0
#: Outside a run (no deadline known) a request is tried this many times at most.
MAX_TRIES_WITHOUT_DEADLINE = 5

#: When the current run must be finished (``time.monotonic()``), set by call_with_retries.
deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "baton_run_deadline", default=None)

def _aiohttp_kinds(link: BaseException) -> Kind | None:
    """How an aiohttp error classifies, None for any other error. httpx_aiohttp maps
    aiohttp's errors coarsely: classify by the original one. aiohttp is imported only by
    the Hands' first HTTP request (hands.http), so an error that is not from it is not
    asked about it."""
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is None or not isinstance(link, aiohttp.ClientError):
        return None
    if isinstance(link, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return "final"
    if isinstance(link, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
        return "never_sent"
    return "ambiguous"

_HTTPX_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_HTTPX_AMBIGUOUS = (httpx.ReadTimeout, httpx.WriteTimeout, httpx.ReadError, httpx.WriteError,
                    httpx.RemoteProtocolError)
_OS_NEVER_SENT = (ConnectionRefusedError, socket.gaierror)


def classify(exc: BaseException, declared: tuple[type[BaseException], ...] = ()) -> Kind:
    """What ``exc`` proves about whether the call acted (see the module table)."""
    if declared and isinstance(exc, declared):
        return "declared"
    # The shared client's bounds (hands.http): a deadline may pass after the request arrived;
    # a body too large arrives the same way again.
    if isinstance(exc, RequestDeadlineExceeded):
        return "ambiguous"
    if isinstance(exc, ResponseTooLarge):
        return "final"
    for link in _chain(exc):  # the original error decides when a library re-raised it
        kind = _aiohttp_kinds(link)
        if kind is not None:
            return kind
    if isinstance(exc, _HTTPX_NEVER_SENT + _OS_NEVER_SENT):
        return "never_sent"
    if isinstance(exc, (*_HTTPX_AMBIGUOUS, ConnectionResetError, BrokenPipeError)):
        return "ambiguous"
    return "final"


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in seen and len(seen) < 8:
        seen.append(link)
        link = link.__cause__ or link.__context__
    return seen[::-1]  # the original first


class Backoff:
    """Jittered exponential waits that must end before the run's deadline."""

    def __init__(self) -> None:
        self.bound = BACKOFF_S
        self.tries = 0

    def next_wait(self) -> float | None:
        """How long to wait before the next try, or None when there is no time left."""
        self.tries += 1
        wait = random.uniform(self.bound / 2, self.bound)
        self.bound = min(self.bound * 2, BACKOFF_MAX_S)
        end = deadline.get()
        if end is None:
            return wait if self.tries < MAX_TRIES_WITHOUT_DEADLINE else None
        # Leave room for the try itself: a retry that cannot finish is not worth starting.
        return wait if time.monotonic() + wait + BACKOFF_S < end else None


class RetryTransport(httpx.AsyncBaseTransport):
    """Re-sends a request whose earlier try provably never left (see :func:`classify`).

    Requests whose body is a stream are not retried: it may be consumed already.
    """

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        backoff: Backoff | None = None  # made at the first failure: most requests have none
        while True:
            try:
                return await self.inner.handle_async_request(request)
            except Exception as exc:
                if classify(exc) != "never_sent" or not _replayable(request):
                    raise
                backoff = backoff or Backoff()
                wait = backoff.next_wait()
                if wait is None:
                    raise
                log.info("request_retried", reason=_describe(exc), tries=backoff.tries,
                         wait_ms=round(wait * 1000))
                await asyncio.sleep(wait)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _replayable(request: httpx.Request) -> bool:
    try:
        request.content  # noqa: B018 - raises RequestNotRead for a streamed body
    except httpx.RequestNotRead:
        return False
    return True


async def call_with_retries(
    call: Callable[[], Awaitable[Any]], *, timeout: float,  # noqa: ASYNC109
    replay: str, retry_on: tuple[type[BaseException], ...],
    confirm: Callable[[], Awaitable[Any]] | None,
) -> tuple[Any, bool]:
    """Run the tool ``call``, retrying what :func:`classify` allows within ``timeout``.

    After an ambiguous failure a ``confirm`` tool runs ``confirm`` first: a found result is
    adopted. Returns (output, confirmed): ``confirmed`` says the output came from confirm.
    """
    token = deadline.set(time.monotonic() + timeout)
    try:
        backoff: Backoff | None = None  # made at the first failure: most calls have none
        while True:
            try:
                return await call(), False
            except Exception as exc:
                kind = classify(exc, retry_on)
                # An unsafe tool may have acted before the call that failed to connect: only
                # its single request is re-sent (RetryTransport), never the whole tool.
                if kind == "final" or (kind != "declared" and replay == "unsafe"):
                    raise
                if kind == "ambiguous" and replay == "confirm" and confirm is not None:
                    found = await confirm()  # its own failure is the run's error
                    if found is not None:
                        log.info("confirm_adopted", reason=_describe(exc))
                        return found, True
                elif kind == "ambiguous" and replay != "safe":
                    raise
                backoff = backoff or Backoff()
                wait = backoff.next_wait()
                if wait is None:
                    raise
                log.info("tool_retried", kind=kind, reason=_describe(exc), tries=backoff.tries,
                         wait_ms=round(wait * 1000))
                await asyncio.sleep(wait)
    finally:
        deadline.reset(token)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


__all__ = ["Backoff", "Kind", "RetryTransport", "call_with_retries", "classify", "deadline"]
