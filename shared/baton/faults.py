"""Named fault points for crash tests: a process SIGKILLs itself at a chosen step.

Enabled only through ``BATON_FAULT`` (``Settings.fault``): ``point`` kills at the first hit,
``point@N`` at the N-th; several specs may be joined with commas. With the setting empty
(always, outside crash tests) :meth:`Faults.hit` is a dictionary lookup and nothing more.

Points used by the services:

    submit.after_commit       client: the submit committed, the reply not yet returned
    brain.after_wake          Brain: a wake was received, the lease taken, nothing applied yet
                              (or the signal of a held session's results: the lease kept, the
                              state loaded, nothing applied yet; see brain.held)
    brain.during_model        Brain: inside the model call (the request phase is running)
    brain.after_intent_commit Brain: response + tool intents + outbox committed, before more
    brain.in_phase            Brain: a custom task's phase is about to run (marked running)
    relay.after_publish       relay: rows published to NATS, not yet removed from the outbox
    hands.after_claim         Hands: attempt claimed (accepted), tool not started
    hands.after_effect        Hands: the tool acted on the outside world, result not committed
    hands.after_complete      Hands: result committed, JetStream message not yet acked
"""

from __future__ import annotations

import os
import signal
import sys

from baton.observability.log import get_logger

POINTS = frozenset(
    {
        "submit.after_commit",
        "brain.after_wake",
        "brain.during_model",
        "brain.after_intent_commit",
        "brain.in_phase",
        "relay.after_publish",
        "hands.after_claim",
        "hands.after_effect",
        "hands.after_complete",
    }
)


class Faults:
    def __init__(self, spec: str = "") -> None:
        self._at: dict[str, int] = {}
        self._hits: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, _, nth = part.partition("@")
            if name not in POINTS:
                known = ", ".join(sorted(POINTS))
                raise ValueError(f"unknown fault point {name!r}; known: {known}")
            self._at[name] = int(nth or 1)

    def __bool__(self) -> bool:
        return bool(self._at)

    def hit(self, name: str, **facts: object) -> None:
        """Die here (SIGKILL, no cleanup) if this point is armed and its count is reached.

        ``facts`` go into the log line, so a test can check what the process held then.
        """
        if name not in self._at:
            return
        self._hits[name] = self._hits.get(name, 0) + 1
        if self._hits[name] == self._at[name]:
            get_logger("baton.fault").warning("fault_point_hit", point=name, **facts)
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
