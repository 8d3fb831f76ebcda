"""The input a client writes: the session it goes to, and the checks of what it names.

A write names its session, or derives one from its request id (:func:`session_for`), so a
retried write whose first reply was lost reaches the session the first attempt created,
where the request id is deduplicated. The ids of what a write creates derive from the same
parts (:func:`derived_id`). The checks refuse, with a clear error and before anything is
written, a request no Brain could ever serve: an agent or a task kind an ``Agent`` or a
``TaskDef`` cannot declare, a compat level below 1.
"""

from __future__ import annotations

import hashlib
import uuid

from baton.errors import ValidationError
from baton.models import NAME, is_task_kind

__all__ = ["GENERATION", "agent_for", "check_agent", "check_compat", "check_task",
           "derived_id", "session_for"]

GENERATION = "generation"


def derived_id(prefix: str, *parts: str) -> str:
    """``<prefix>-<20 hex digits>``: the same parts always give the same id."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:20]
    return f"{prefix}-{digest}"


def session_for(session_id: str | None, request_id: str | None) -> str:
    """The session a write goes to: the one named, else one derived from the request id.

    A retried write without a session (its first reply was lost) must reach the session the
    first attempt created, where the request id is deduplicated; a fresh session would accept
    the same input twice. Only a write with neither id gets a new random session. The
    derivation is the one the HTTP API uses for an ``Idempotency-Key``, so a key retried
    through the API or the CLI reaches the same submission.
    """
    if session_id:
        return session_id
    if request_id:
        return derived_id("s", "api", request_id)
    return f"s-{uuid.uuid4().hex[:16]}"


def agent_for(kind: str, agent: str | None) -> str:
    """The agent a task is started for: ``agent``, or by default the kind itself (as
    ``baton start`` and ``POST /v1/tasks`` do), when the kind can be an agent's name."""
    if agent is not None:
        return agent
    if not isinstance(kind, str) or not NAME.match(kind):
        raise ValidationError(f"name the agent whose Brains run task kind {kind!r} (--agent, "
                              f"or \"agent\" in the API): the kind is not an agent name "
                              f"(1-64 of a-z 0-9 _ - starting with a letter)", kind=str(kind))
    return kind


def check_agent(agent: str) -> None:
    """Only an agent an ``Agent`` can declare is served by a Brain: a request for another
    would wait forever."""
    if not isinstance(agent, str) or not NAME.match(agent):
        raise ValidationError(f"invalid agent name {agent!r}: 1-64 of a-z 0-9 _ - starting "
                              f"with a letter, as Agent declares it", agent=str(agent)[:64])


def check_task(kind: str, task_input: object) -> None:
    """A kind a ``TaskDef`` can declare, and a JSON object as input."""
    if not is_task_kind(kind):
        raise ValidationError(f"invalid task kind {kind!r}: a TaskDef's kind (not empty, "
                              f"no '|', not {GENERATION!r})", kind=str(kind)[:64])
    if task_input is not None and not isinstance(task_input, dict):
        raise ValidationError(f"a task's input is a JSON object, not "
                              f"{type(task_input).__name__}", kind=kind)


def check_compat(compat: int) -> None:
    """A session's compat level is 1 or more, as an Agent's: no Brain serves another."""
    if isinstance(compat, bool) or not isinstance(compat, int) or compat < 1:
        raise ValidationError(f"compat level must be an integer of 1 or more, not {compat!r}",
                              compat=compat)
