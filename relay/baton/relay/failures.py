"""How the relay tells "not now" from "never", and how long it waits before trying again.

A NATS or Redis error in :data:`NATS_DOWN` / :data:`REDIS_DOWN` means the server is not
reachable right now: the rows stay pending in the outbox and the loop retries with a capped
:class:`Backoff`. A row NATS refuses for good is the publisher's business
(:mod:`baton.relay.publisher`): it is dead-lettered, never retried.
"""

from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors
from redis.exceptions import RedisClusterException, RedisError

from baton.errors import NatsUnavailable, UnavailableError

__all__ = ["NATS_DOWN", "REDIS_DOWN", "Backoff", "reraise_cancel"]

BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0
# Errors of a NATS call meaning "not now": retry later.
NATS_DOWN = (NatsUnavailable, nats.errors.Error, nats.js.errors.ServiceUnavailableError,
             TimeoutError)
# Errors of a Redis call meaning "not now". redis-py's RedisClusterException (no node
# serves a slot, a failover in progress) is not a RedisError: without it here a cluster
# hiccup would end the relay's task group instead of being retried.
REDIS_DOWN = (RedisError, RedisClusterException, OSError, UnavailableError)


def reraise_cancel() -> None:
    """Re-raise a cancellation an error handler would otherwise swallow.

    On Python 3.11 a cancel that lands as a library's own timeout expires can surface as
    TimeoutError, which the loops treat as "NATS down, retry": the task would go on
    looping, cancelled, and its task group would never end.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class Backoff:
    """Doubling delays from :data:`BACKOFF_MIN_S` up to :data:`BACKOFF_MAX_S`; reset on
    success."""

    def __init__(self) -> None:
        self.delay = 0.0

    def next(self) -> float:
        self.delay = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, self.delay * 2))
        return self.delay

    def reset(self) -> None:
        self.delay = 0.0
