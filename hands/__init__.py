"""Hands: the workers that execute tools under attempt fences.

Public surface: :class:`HandsWorker` (the service), :func:`main` (the ``baton hands`` entry
point) and the pure replay-policy decision :func:`decide` / :class:`ReplayDecision`. The
shipped tools live in :mod:`baton.hands.tools`.
"""

from baton.hands.replay import ReplayDecision, decide
from baton.hands.worker import HandsWorker, main

__all__ = ["HandsWorker", "ReplayDecision", "decide", "main"]
