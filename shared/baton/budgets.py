"""What a model's budget at its provider is: concurrent requests, requests and tokens per
minute, shared by every Brain. Pure: :mod:`baton.store.budgets` holds them for the fleet in
Redis, :mod:`baton.brain.budget` waits for them around each model call.

A budget is declared per provider and model, keyed ``provider/model`` (an agent's
``openai:gpt-4o-mini`` is the budget ``openai/gpt-4o-mini``; a model the app brings itself
is keyed by the name agents use), in ``BATON_MODEL_BUDGETS`` (JSON) or on the App::

    BATON_MODEL_BUDGETS='{"openai/gpt-4o-mini": {"rpm": 500, "tpm": 200000, "concurrency": 50}}'
    App(..., model_budgets={"openai/gpt-4o-mini": ModelBudget(rpm=500, tpm=200_000)})

The setting's entry wins over the App's for the same model. A model without a budget costs
nothing per call (no Redis call). A budgeted model's 429 with ``Retry-After`` pauses its
budget for the whole fleet (every Brain's next call waits that long), even a budget that
declares no limit (``{}``: share the provider's pauses only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from baton.errors import ConfigError
from baton.store.keys import valid_model_key

__all__ = ["ModelBudget", "budget_key", "parse_budgets"]

_FIELDS = ("rpm", "tpm", "concurrency", "burst_s")


def budget_key(model: str) -> str:
    """The budget key of an agent's model name: ``provider:model`` -> ``provider/model``."""
    provider, sep, name = model.partition(":")
    return f"{provider}/{name}" if sep and "/" not in provider else model


@dataclass(frozen=True, slots=True)
class ModelBudget:
    """At most ``concurrency`` calls at once across the fleet (0: no cap), ``rpm`` calls and
    ``tpm`` tokens a minute (0: no rate); ``burst_s``: how many seconds' worth of each rate
    may go at once (a call costing more tokens than that goes once the rate caught up)."""

    rpm: int = 0
    tpm: int = 0
    concurrency: int = 0
    burst_s: float = 1.0

    def __post_init__(self) -> None:
        ints = (self.rpm, self.tpm, self.concurrency)
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in ints) or \
                not isinstance(self.burst_s, int | float) or not math.isfinite(self.burst_s) \
                or not 0 <= self.burst_s <= 3600:
            raise ConfigError(f"invalid model budget {self!r}: rpm, tpm and concurrency are "
                              "integers >= 0 (0: none), burst_s seconds from 0 to 3600")

    @property
    def burst_ms(self) -> int:
        return round(self.burst_s * 1000)

    @classmethod
    def of(cls, raw: object) -> ModelBudget:
        """A budget from its JSON object (``{"rpm": .., "tpm": .., "concurrency": ..,
        "burst_s": ..}``, each optional); raises ConfigError if malformed."""
        if isinstance(raw, ModelBudget):
            return raw
        if not isinstance(raw, Mapping):
            raise ConfigError(f"a model budget is an object, not {str(raw)[:60]!r}")
        unknown = sorted(set(raw) - set(_FIELDS))
        if unknown:
            raise ConfigError(f"unknown model budget field(s) {', '.join(map(str, unknown))}: "
                              f"use {', '.join(_FIELDS)}")
        return cls(**{str(k): v for k, v in raw.items()})

    def as_dict(self) -> dict[str, float | int]:
        """As a Brain announces it (read back by :meth:`of`)."""
        return {"rpm": self.rpm, "tpm": self.tpm, "concurrency": self.concurrency,
                "burst_s": self.burst_s}

    def describe(self) -> str:
        parts = []
        if self.concurrency:
            parts.append(f"{self.concurrency} at once")
        if self.rpm:
            parts.append(f"{self.rpm} requests/min")
        if self.tpm:
            parts.append(f"{self.tpm} tokens/min")
        return ", ".join(parts) or "pauses only"


def parse_budgets(raw: str | Mapping[str, Any] | None) -> dict[str, ModelBudget]:
    """Budgets by key from ``BATON_MODEL_BUDGETS``'s JSON text (or a mapping); each key is
    a model's name (``provider/model`` or ``provider:model``). Raises ConfigError."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:
            raw = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"model budgets are not JSON: {exc}") from None
    if not isinstance(raw, Mapping):
        raise ConfigError("model budgets are a JSON object: {\"provider/model\": {\"rpm\": "
                          "500, \"tpm\": 200000, \"concurrency\": 50}}")
    out: dict[str, ModelBudget] = {}
    for name, value in raw.items():
        key = budget_key(str(name))
        if not valid_model_key(key):
            raise ConfigError(f"invalid model {str(name)[:100]!r} in model budgets: 1-200 of "
                              "A-Z a-z 0-9 . _ : / @ + -")
        try:
            out[key] = ModelBudget.of(value)
        except (ConfigError, TypeError) as exc:
            raise ConfigError(f"model budget {key}: {exc}") from None
    return out
