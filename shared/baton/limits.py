"""What a tool's fleet-wide limits are: a concurrency cap and a rate, as a tool declares them
(``@tool(max_concurrency=3, rate="20/s")``). Pure: :mod:`baton.store.limits` holds them for
the fleet in Redis.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from baton.errors import ConfigError

__all__ = ["ToolLimit", "parse_rate"]

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$")
_PER = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
        "h": 3600.0, "hour": 3600.0}


def parse_rate(text: str) -> float:
    """Admissions per second of a rate written ``"R/s"``, ``"R/min"`` or ``"R/h"``."""
    m = _RATE.match(text)
    if m is None or float(m.group(1)) <= 0:
        raise ConfigError(f"invalid rate {text[:50]!r}: write it as R/s, R/min or R/h with "
                          "R > 0 (\"20/s\", \"600/min\")")
    return float(m.group(1)) / _PER[m.group(2)]


@dataclass(frozen=True, slots=True)
class ToolLimit:
    """What a tool declares: at most ``max_concurrency`` runs at once across the fleet (0:
    no cap) and ``per_second`` admissions a second (0: no rate), ``burst`` at once."""

    max_concurrency: int = 0
    per_second: float = 0.0
    burst: int = 1

    def __post_init__(self) -> None:
        if self.max_concurrency < 0 or self.per_second < 0 or self.burst < 1 or \
                not math.isfinite(self.per_second):
            raise ConfigError(f"invalid tool limit {self!r}: max_concurrency >= 0, a rate "
                              "> 0 (or none), burst >= 1")

    @property
    def limited(self) -> bool:
        return self.max_concurrency > 0 or self.per_second > 0

    @property
    def interval_ms(self) -> int:
        """Milliseconds between admissions at the rate (0: no rate)."""
        return max(1, round(1000 / self.per_second)) if self.per_second > 0 else 0

    def as_dict(self) -> dict[str, float | int]:
        """As announced by the Hands serving the tool (read back by :meth:`of`)."""
        return {"max_concurrency": self.max_concurrency, "per_second": self.per_second,
                "burst": self.burst}

    @classmethod
    def of(cls, announced: object) -> ToolLimit:
        """The limit a Hands announced (:meth:`as_dict`); raises ValueError if malformed."""
        if not isinstance(announced, dict):
            raise ValueError(f"not an object: {str(announced)[:60]!r}")
        try:
            return cls(int(announced.get("max_concurrency", 0)),
                       float(announced.get("per_second", 0.0)), int(announced.get("burst", 1)))
        except (ConfigError, TypeError) as exc:
            raise ValueError(str(exc)) from None

    def describe(self) -> str:
        parts = []
        if self.max_concurrency:
            parts.append(f"{self.max_concurrency} at once")
        if self.per_second:
            parts.append(f"{self.per_second:g}/s" + (f" (burst {self.burst})"
                                                     if self.burst > 1 else ""))
        return ", ".join(parts) or "no limit"
