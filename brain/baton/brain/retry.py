"""When a generation task tries its model again after a retryable failure.

Exponential backoff from ``Settings.model_backoff_ms`` (doubling per failure, capped at
``model_backoff_max_ms``), unless the server said how long to wait (``Retry-After``), which
is honoured as given. Never past the deadline (``model_retry_deadline_s`` after the first
failure of the request): then the task gives up. No jitter: the time is saved in the task
before anyone waits, so replicas never race each other into the same retry.
"""

from __future__ import annotations

from baton.settings import Settings


def backoff_ms(settings: Settings, failures: int) -> int:
    """The wait after the ``failures``-th failure in a row (1-based)."""
    return min(settings.model_backoff_max_ms,
               settings.model_backoff_ms * 2 ** min(max(failures - 1, 0), 30))


def retry_at(
    settings: Settings, now_ms: int, failures: int, deadline_ms: int,
    retry_after_s: float | None = None,
) -> int | None:
    """The time of the next attempt, or None when it would be past the deadline."""
    wait = (round(retry_after_s * 1000) if retry_after_s is not None
            else backoff_ms(settings, failures))
    until = now_ms + wait
    return until if until <= deadline_ms else None
