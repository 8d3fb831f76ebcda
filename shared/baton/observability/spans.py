"""What every traced seam shares (see :mod:`baton.observability.tracing`): whether to make a
span at all (:func:`recording_tracer`), the propagation headers handed on when none is made
(:func:`headers_to_hand_on`), metric attribute sets made once, and the counters of commits,
refusals and handoffs."""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.trace import SpanKind

from baton.observability.metrics import Attributes, Instruments
from baton.observability.otel_state import state
from baton.observability.propagation import carried, inject, unsampled
from baton.observability.telemetry import tracer

__all__ = [
    "NATS", "NO_SPAN", "SESSION", "count_committed", "count_refused", "db_attrs", "enter_span",
    "headers_to_hand_on", "metric_attrs", "now_ms", "record_handoff", "recording_tracer",
    "session_of",
]

SESSION = "baton.session_id"
NATS = {"messaging.system": "nats"}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def session_of(msg_id: str) -> str | None:
    """The session of an outbox row id ``<session>/<seq>/<n>`` (the ``Nats-Msg-Id``)."""
    head, _, _n = msg_id.rpartition("/")
    session, _, _seq = head.rpartition("/")
    return session or None


def db_attrs(script: str) -> dict[str, str]:
    """Database attributes of a transition: one Lua script run by ``FCALL``."""
    return {"db.system.name": "redis", "db.operation.name": "FCALL",
            "db.stored_procedure.name": script}


# Metric attributes are made once per distinct value set and shared by every measurement
# (the SDK only reads them); the sets are few: roles, ops, commit kinds, hops, subjects.


@functools.lru_cache(maxsize=1024)
def metric_attrs(*pairs: tuple[str, Any]) -> Attributes:
    """The attribute set of ``pairs`` without the empty ones, made once per distinct set."""
    return Attributes((k, v) for k, v in pairs if v)


def count_refused(inst: Instruments | None, op: str, exc: BaseException) -> None:
    if inst is not None:
        inst.refused.add(1, metric_attrs(("baton.role", state.role), ("baton.op", op), (
            "error.type", getattr(exc, "code", type(exc).__name__))))


def count_committed(inst: Instruments | None, op: str, kind: str = "") -> None:
    if inst is not None:
        inst.commits.add(1, metric_attrs(("baton.role", state.role), ("baton.op", op),
                                         ("baton.commit.kind", kind)))


def record_handoff(inst: Instruments, hop: str, since_ms: int | None) -> None:
    if since_ms:
        inst.handoff.record(max(0, now_ms() - since_ms) / 1000, metric_attrs(("baton.hop", hop)))


def recording_tracer() -> Any:
    """Baton's tracer, or None when not tracing or when a span started now would certainly
    not be recorded (:func:`~baton.observability.propagation.unsampled`): the wrappers then
    build no span and no attributes."""
    t = tracer()
    return None if t is None or unsampled() else t


def headers_to_hand_on() -> dict[str, str] | None:
    """The propagation headers of the current context (a span of ours or the host's, or an
    unsampled parent's) to hand on with work this process makes no span for, or None when
    no context is current: propagation goes on without spans."""
    kept = carried()
    if kept is not None:  # an unsampled message's headers, as they came
        return dict(kept)
    if otel_trace.get_current_span().get_span_context().is_valid:
        return inject()
    return None


#: Stands in for a span where none is made (``with NO_SPAN if t is None else enter_span(...)``):
#: no exit stack on the path taken for nearly every message of an unsampled trace.
NO_SPAN: Any = contextlib.nullcontext()


def enter_span(t: Any, name: str, kind: SpanKind = SpanKind.INTERNAL, /, **attributes: Any) -> Any:
    return t.start_as_current_span(
        name, kind=kind, attributes={k: v for k, v in attributes.items() if v is not None})
