"""Poison sessions: state that cannot be decoded is quarantined, never retried for ever.

A session whose stored state a Brain cannot load or process (a wrong-typed key, a meta
hash without its agent, a non-numeric fence, task or entry JSON that does not parse, a
CORRUPT refusal of a script) fails the same way on every Brain and every wake. Each such
failure is counted in the session's poison hash by poison.lua, which checks the keys'
types before it writes; at ``Settings.poison_limit`` the session is quarantined: its
timers are dropped, a dead letter records the reason, its wakes are acknowledged from then
on, and a client waiting on it gets :class:`~baton.errors.QuarantinedError`
(:func:`quarantine_of`). ``baton inspect`` shows the state and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from baton.errors import CorruptStateError, QuarantinedError, from_redis_error
from baton.observability.log import get_logger
from baton.store.deadletter import record_dead_letter
from baton.store.store import Store

log = get_logger("baton.brain")

MAX_REASON = 500


@dataclass(frozen=True, slots=True)
class Verdict:
    tries: int
    quarantined: bool  # now or before: the wake is acknowledged


def reason_of(exc: BaseException) -> str:
    """One line naming the failure (never a traceback)."""
    if isinstance(exc, CorruptStateError):
        text = exc.reason
    else:
        text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:MAX_REASON]


async def count_failure(store: Store, session_id: str, exc: BaseException, limit: int) -> Verdict:
    """Count one failure to process the session; quarantine it at ``limit``."""
    sk = store.keys.session(session_id)
    reason = reason_of(exc)
    try:
        tries, state = await store.scripts.registered.poison(
            keys=[sk.poison, sk.timers], args=[session_id, reason, limit])
    except Exception as err:
        raise from_redis_error(err, session_id=session_id) from None
    state = state.decode() if isinstance(state, bytes) else str(state)
    if state == "quarantined":
        await record_dead_letter(store.redis, store.keys, role="brain", source="session",
                                 reason=f"quarantined after {tries} tries: {reason}",
                                 payload=reason, session_id=session_id)
        log.error("session_quarantined", session_id=session_id, tries=int(tries),
                  reason=reason)
    return Verdict(int(tries), state in ("quarantined", "already"))


async def quarantine_of(store: Store, session_id: str) -> dict[str, str] | None:
    """The session's poison record when it is quarantined, else None."""
    raw = cast(dict[Any, Any], await store.redis.hgetall(store.keys.session(session_id).poison))
    record = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes)
              else v) for k, v in raw.items()}
    return record if "quarantined" in record else None


async def raise_if_quarantined(store: Store, session_id: str) -> None:
    record = await quarantine_of(store, session_id)
    if record is not None:
        raise QuarantinedError(session_id, record.get("quarantine_reason", ""))


__all__ = ["Verdict", "count_failure", "quarantine_of", "raise_if_quarantined", "reason_of"]
