"""Import nats-py without aiohttp, for the service entry points.

nats-py imports aiohttp when it loads, only to offer ``ws://`` server URLs, which Baton's
services never use; aiohttp costs about a third of a worker's start-up CPU. A Hands that
makes HTTP calls imports aiohttp later, when it needs it (baton.hands.http).
"""

from __future__ import annotations

import sys

__all__ = ["import_nats_without_websockets"]


def import_nats_without_websockets() -> None:
    """Load nats-py with its WebSocket transport disabled (an entry point calls this first;
    a process that loaded nats-py or aiohttp already is left as it is)."""
    if "nats" in sys.modules or "aiohttp" in sys.modules:
        return
    sys.modules["aiohttp"] = None  # type: ignore[assignment]  # makes `import aiohttp` fail
    try:
        import nats.aio.transport  # noqa: F401
    finally:
        del sys.modules["aiohttp"]
