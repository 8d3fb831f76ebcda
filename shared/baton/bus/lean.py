"""Import the libraries of a service without the parts it never uses (entry points only).

* nats-py imports aiohttp when it loads, only to offer ``ws://`` server URLs, which Baton's
  services never use; aiohttp costs about a third of a worker's start-up CPU. A Hands that
  makes HTTP calls imports aiohttp later, when it needs it (baton.hands.http).
* redis-py imports the OpenTelemetry metrics SDK, when installed, for its own optional
  instrumentation, which Baton does not turn on (Baton's telemetry loads the SDK itself
  when an exporter is configured, baton.observability.telemetry).
* structlog imports rich to render exceptions on a terminal; services log JSON lines or
  plain console lines, and rich is the CLI's (tables, progress).
* httpx imports click, pygments and rich for its own command line (``httpx URL``).

Each is done by making ``import X`` fail while the library loads (it treats X as not
installed); X stays importable afterwards.
"""

from __future__ import annotations

import sys

__all__ = ["import_nats_without_websockets", "import_service_libraries"]


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


def _import_without(module: str, missing: str) -> None:
    """Import ``module`` as if ``missing`` were not installed (unless it is loaded)."""
    if module in sys.modules:
        return
    loaded = sys.modules.get(missing)
    sys.modules[missing] = None  # type: ignore[assignment]
    try:
        __import__(module)
    finally:
        if loaded is None:
            del sys.modules[missing]
        else:
            sys.modules[missing] = loaded


def import_service_libraries() -> None:
    """What a service's entry point calls first: nats-py, redis-py and structlog, lean."""
    import_nats_without_websockets()
    _import_without("redis", "opentelemetry.sdk")
    _import_without("structlog", "rich")
    _import_without("httpx", "click")
