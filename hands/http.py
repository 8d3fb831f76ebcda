"""The Hands' shared HTTP client: httpx's API over aiohttp's connection pool.

httpcore's pool scans every connection per request, about 5x the CPU per call at 32 calls
in flight, hence aiohttp underneath. It is imported here, when the worker builds its client
before serving: a first request must never wait for an import (it would stall the event
loop, and with it the heartbeats of the messages in hand).
"""

from __future__ import annotations

import httpx
from httpx_aiohttp import AiohttpTransport

from baton.hands.retries import RetryTransport
from baton.settings import Settings

__all__ = ["http_client"]


def http_client(settings: Settings) -> httpx.AsyncClient:
    """The client tools get as ``ctx.http``: re-sends only what provably never left."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(30.0, connect=settings.connect_timeout_s),
        transport=RetryTransport(AiohttpTransport(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))),
    )
