"""Hands: the workers that execute tools under attempt fences.

Public surface: :class:`HandsWorker` (the service), :func:`main` (the ``baton hands`` entry
point) and the pure replay-policy decision :func:`decide` / :class:`ReplayDecision`. The
shipped tools live in :mod:`baton.hands.tools`.

Names are imported on first use: an isolated tool's child (``python -m
baton.hands.isolated``) imports this package and should not load the worker, NATS and
Redis clients it never uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from baton.hands.replay import ReplayDecision, decide
    from baton.hands.worker import HandsWorker, main

__all__ = ["HandsWorker", "ReplayDecision", "decide", "main"]

_EXPORTS = {
    "HandsWorker": "baton.hands.worker",
    "main": "baton.hands.worker",
    "ReplayDecision": "baton.hands.replay",
    "decide": "baton.hands.replay",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'baton.hands' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
