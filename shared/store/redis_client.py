"""How a process connects to Redis: one client per role, failing fast, never retrying.

Owns :func:`connect_redis` (the pool, timeouts and TLS files from :class:`Settings`) and
:func:`redis_user`, the ACL user the URL names.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from baton.errors import ConfigError
from baton.settings import Settings


def connect_redis(settings: Settings, *, socket_timeout: float | None = 10.0) -> Redis:
    """A client that fails fast and never retries on its own.

    Automatic retries are off on purpose: re-sending a commit whose reply was lost could
    apply it twice. Callers decide what is safe to retry (submit is idempotent, a Brain
    re-acquires and reloads, a Hands attempt re-checks its run).

    The pool is a blocking one: past ``redis_max_connections`` a caller waits for a free
    connection (up to the connect timeout) instead of failing at once, as a burst of
    concurrent tool runs and heartbeats would otherwise make it.
    """
    pool = BlockingConnectionPool.from_url(
        settings.redis_url,
        max_connections=settings.redis_max_connections,
        timeout=max(settings.connect_timeout_s, 5.0),
        decode_responses=True,
        socket_connect_timeout=settings.connect_timeout_s,
        socket_timeout=socket_timeout,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=30,
        **_tls_options(settings),
    )
    return Redis.from_pool(pool)  # the client owns the pool: aclose() closes it


def _tls_options(settings: Settings) -> dict[str, Any]:
    """TLS files for a ``rediss://`` URL (a CA bundle, and a client cert for mutual TLS)."""
    s = settings
    files = {"ssl_ca_certs": s.redis_tls_ca, "ssl_certfile": s.redis_tls_cert,
             "ssl_keyfile": s.redis_tls_key}
    if not s.redis_url.startswith("rediss://"):
        if any(files.values()):
            raise ConfigError("BATON_REDIS_TLS_* is set but BATON_REDIS_URL is not rediss://")
        return {}
    return {k: v for k, v in files.items() if v}


def redis_user(settings: Settings) -> str:
    """The ACL user of the Redis URL ("default" when none is named)."""
    return urlsplit(settings.redis_url).username or "default"


__all__ = ["connect_redis", "redis_user"]
