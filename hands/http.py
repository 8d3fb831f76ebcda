"""The Hands' shared HTTP client: httpx's API over aiohttp's connection pool.

httpcore's pool scans every connection per request, about 5x the CPU per call at 32 calls
in flight, hence aiohttp underneath. Importing aiohttp costs about as much CPU as the rest
of a Hands' start, so the pool is built on the first request: :func:`warm` imports it in a
thread once the worker serves, and a worker whose tools make no HTTP calls never pays it.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import httpx

from baton.hands.retries import RetryTransport
from baton.settings import Settings

__all__ = ["http_client", "warm"]

_MODULE = "httpx_aiohttp"


class _Deferred(httpx.AsyncBaseTransport):
    """An aiohttp-backed transport made on the first request."""

    def __init__(self, limits: httpx.Limits) -> None:
        self.limits = limits
        self.inner: httpx.AsyncBaseTransport | None = None

    def _transport(self) -> httpx.AsyncBaseTransport:
        if self.inner is None:
            module: Any = importlib.import_module(_MODULE)
            self.inner = module.AiohttpTransport(limits=self.limits)
        return self.inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._transport().handle_async_request(request)

    async def aclose(self) -> None:
        if self.inner is not None:
            await self.inner.aclose()


def http_client(settings: Settings) -> httpx.AsyncClient:
    """The client tools get as ``ctx.http``: re-sends only what provably never left."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(30.0, connect=settings.connect_timeout_s),
        transport=RetryTransport(_Deferred(
            httpx.Limits(max_connections=None, max_keepalive_connections=256))),
    )


async def warm() -> None:
    """Import the pool's library off the event loop (the first request then finds it)."""
    await asyncio.to_thread(importlib.import_module, _MODULE)
