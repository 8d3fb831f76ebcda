"""The store's clock: wall time in epoch milliseconds, the unit of every record's times."""

from __future__ import annotations

import time

__all__ = ["now_ms"]


def now_ms() -> int:
    """Now, in milliseconds since the epoch."""
    return time.time_ns() // 1_000_000
