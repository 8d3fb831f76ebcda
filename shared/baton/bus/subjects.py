"""Bus names: the streams, subjects and durable consumers of one namespace.

Pure and usable without a connection (the client, the ACL generator and the Brain's context
use it). Every token that goes into a subject is checked by :func:`_token`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from baton.errors import ValidationError

__all__ = ["BusNames"]

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _token(kind: str, value: object) -> str:
    text = str(value)
    if not _TOKEN.match(text):
        raise ValidationError(
            f"invalid {kind} {text!r}: use 1-64 of A-Z a-z 0-9 _ - (no spaces, dots, * or >)",
            field=kind, value=text,
        )
    return text


@dataclass(frozen=True, slots=True)
class BusNames:
    """Stream, subject and durable names of one namespace; pure, usable without a connection."""

    namespace: str

    @property
    def prefix(self) -> str:
        return self.namespace.upper().replace("-", "_")

    @property
    def wake_stream(self) -> str:
        return f"{self.prefix}_WAKE"

    @property
    def tool_stream(self) -> str:
        return f"{self.prefix}_TOOLS"

    def wake_subject(self, agent: str, compat: str | int) -> str:
        return f"{self.namespace}.wake.{_token('agent', agent)}.{_token('compat', compat)}"

    def tool_subject(self, tool: str) -> str:
        return f"{self.namespace}.tool.{_token('tool', tool)}"

    def wake_durable(self, agent: str, compat: str | int) -> str:
        return f"wake_{_token('agent', agent)}_{_token('compat', compat)}"

    def tool_durable(self, tool: str) -> str:
        return f"tool_{_token('tool', tool)}"

    def consumers_subject(self, role: str) -> str:
        """Core NATS: a worker of ``role`` asks the relays for its durable consumer
        (:mod:`baton.bus.consumers`); only that role may publish here."""
        return f"{self.namespace}.consumers.{_token('role', role)}"

    def fallback_subject(self, subject: str) -> str:
        """Core NATS (no stream): where a relay sends a copy of a message for ``subject``
        (a wake or tool subject) that its stream cannot take now, a leader election under
        way (:mod:`baton.bus.fallback`): ``ns.wake.a.1`` -> ``ns.fallback.wake.a.1``."""
        prefix = f"{self.namespace}."
        if not subject.startswith(prefix):
            raise ValidationError(f"subject {subject[:200]!r} is not in namespace "
                                  f"{self.namespace!r}", field="subject", value=subject[:200])
        return f"{self.namespace}.fallback.{subject[len(prefix):]}"

    def limits_subject(self, tool: str) -> str:
        """Core NATS (no stream): a Hands freed a slot of ``tool``'s fleet-wide cap and runs
        wait for one (baton.store.limits); Hands only."""
        return f"{self.namespace}.limits.{_token('tool', tool)}"

    def budget_subject(self, model: str) -> str:
        """Core NATS (no stream): a Brain freed a slot of a model's fleet-wide budget and calls
        wait for one (baton.store.budgets); Brains only. ``model``: the budget's key
        (``provider/model``), by digest: a model's name may hold dots."""
        digest = hashlib.sha256(model.encode()).hexdigest()[:16]
        return f"{self.namespace}.budget.{digest}"

    @property
    def timers_subject(self) -> str:
        """Core NATS (no stream): a Brain's commit armed a timer; relays look at their heads."""
        return f"{self.namespace}.timers"
