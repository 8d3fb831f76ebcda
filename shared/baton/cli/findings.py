"""Reading state that may be corrupt, for the read-only views (inspect, watch, trace).

An operator looks at a store most when something is wrong with it: a key of the wrong type,
a hash without a field, JSON that does not parse. The views read each part on its own and
turn a part that cannot be read or decoded into a *finding*, one line naming the key or
record and the reason, and show the rest. Only an unreachable Redis stops a view (one clear
line from the command), since then nothing can be shown at all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from baton.errors import RedisUnavailable
from baton.models import SessionMeta
from baton.store.state import parse_meta

__all__ = ["Findings", "lenient_meta", "meta_problems"]

MAX_FINDING = 300
_INT_FIELDS = ("compat", "fence", "lease_until", "seq", "created", "handed")


def _unreachable(exc: BaseException) -> bool:
    import redis.exceptions as rex

    return isinstance(exc, RedisUnavailable | rex.ConnectionError | rex.TimeoutError
                      | ConnectionError | TimeoutError)


def _refused(why: str | BaseException) -> bool:
    from redis.exceptions import NoPermissionError

    return isinstance(why, NoPermissionError)


def _reason(exc: BaseException) -> str:
    from redis.exceptions import ResponseError

    from baton.errors import BatonError

    text = str(exc) if isinstance(exc, ResponseError | BatonError) else (
        f"{type(exc).__name__}: {exc}")
    return " ".join(text.split())


_NOT_READABLE = "not readable with this credential (an operator's shows them)"


class Findings(list[str]):
    """What could not be read or decoded, one line each, in the order found."""

    def add(self, what: str, why: str | BaseException) -> None:
        text = _reason(why) if isinstance(why, BaseException) else why
        line = f"{what}: {text}"
        if _refused(why):  # a role's ACL, not corruption: one line per kind of key
            kind = " ".join(w for w in what.split() if "{" not in w)
            line = f"{kind}: {_NOT_READABLE}"
        if line not in self:
            self.append(line[:MAX_FINDING])

    def refused(self, kind: str) -> bool:
        """Whether this credential was refused reading the keys of ``kind`` (e.g.
        "sessions index"), not that they were empty."""
        return f"{kind}: {_NOT_READABLE}" in self

    async def read(self, what: str, aw: Awaitable[Any], default: Any) -> Any:
        """``await aw``; on anything but an unreachable Redis a finding and ``default``."""
        try:
            return await aw
        except Exception as exc:
            if _unreachable(exc):
                raise
            self.add(what, exc)
            return default

    def parse(self, what: str, default: Any, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``; when it raises, a finding and ``default``."""
        try:
            return fn(*args)
        except Exception as exc:
            self.add(what, exc)
            return default

    def reply(self, what: str, value: Any, default: Any) -> Any:
        """A pipeline reply read with ``raise_on_error=False``: the error becomes a finding."""
        if isinstance(value, BaseException):
            if _unreachable(value):
                raise value
            self.add(what, value)
            return default
        return value


def meta_problems(m: dict[str, str]) -> list[str]:
    """What keeps a meta hash from parsing, in words (empty when it parses)."""
    problems = [f"no {f}" for f in ("agent", "compat", "wake") if f not in m]
    for f in _INT_FIELDS:
        if f in m and not _is_int(m[f]):
            problems.append(f"{f} is not an integer ({m[f][:40]!r})")
    problems += [f"{k} is not an integer ({v[:40]!r})" for k, v in m.items()
                 if k.startswith("grp:") and not _is_int(v)]
    return problems


def lenient_meta(session_id: str, m: dict[str, str], findings: Findings,
                 key: str = "meta hash", runs: dict[str, str] | None = None) -> SessionMeta:
    """The meta hash as far as it parses (with the group counters of the run records,
    ``runs``); each problem is a finding."""
    runs = {k: v for k, v in (runs or {}).items() if k.startswith("grp:")}
    problems = meta_problems(m) + [f"group counter {k} is not a number: {v[:40]!r}"
                                   for k, v in runs.items() if not _is_int(v)]
    runs = {k: v for k, v in runs.items() if _is_int(v)}
    if not problems:
        try:
            return parse_meta(session_id, m, runs)
        except Exception as exc:  # a problem meta_problems does not know of
            problems = [_reason(exc)]
    for p in problems:
        findings.add(key, p)
    clean = {k: v for k, v in m.items()
             if not ((k in _INT_FIELDS or k.startswith("grp:")) and not _is_int(v))}
    clean.setdefault("agent", "?")
    clean.setdefault("compat", "0")
    clean.setdefault("wake", "")
    try:
        return parse_meta(session_id, clean, runs)
    except Exception:
        return parse_meta(session_id, {"agent": "?", "compat": "0", "wake": ""})


def _is_int(value: str) -> bool:
    try:
        int(value)
    except (TypeError, ValueError):
        return False
    return True
