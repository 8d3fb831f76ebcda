"""New traces the sampler drops, begun without the SDK's span machinery.

A relay publishing a row that carries no trace context (the submit of a client that does
not trace, a timer's wake) begins a trace there. Under ``parentbased_traceidratio`` at 0.01,
99 such roots in 100 are dropped, and for each the SDK still draws the ids, asks the
sampler, makes a ``NonRecordingSpan`` and its context, and formats the header through the
propagators (about 20 µs a row with the publish around it, once per session).

Under the TracerProvider Baton's own entry points install (with :func:`id_generator`),
:func:`dropped_root` draws the trace id first and asks the provider's own sampler about
it, as the SDK would: a dropped root is then only its ``traceparent`` (about half the
cost). A root the sampler keeps is left to the SDK, on the same trace id: the generator
hands the id drawn to the next root started on this thread, so the decision and the ids
are the SDK's either way. Only for samplers that decide on the trace id alone (always on
or off, trace id ratio, and their parent-based forms; see ``telemetry._sampler_traits``).

Like all of the SDK, imported by ``telemetry.setup`` only.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from opentelemetry.trace import SpanKind, TraceFlags

__all__ = ["dropped_root", "id_generator"]


class _Ahead(threading.local):
    trace_id = 0  # none drawn ahead (a class default: no lookup failure on other threads)


@functools.cache
def _root_ids() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class RootIds(RandomIdGenerator):
        """The SDK's random ids, except that a trace id :func:`dropped_root` drew for a
        root it left to the SDK is the next trace id handed out on the same thread."""

        def __init__(self) -> None:
            self._ahead = _Ahead()
            # A dropped root's traceparent flags, as the SDK sets them.
            random = TraceFlags.RANDOM_TRACE_ID if self.is_trace_id_random() else 0
            self.unsampled_flags = f"{TraceFlags.DEFAULT | random:02x}"

        def generate_trace_id(self) -> int:
            ahead = self._ahead.trace_id
            if ahead:
                self._ahead.trace_id = 0
                return ahead
            return super().generate_trace_id()

        def draw(self) -> int:
            return super().generate_trace_id()

        def keep_for_next_root(self, trace_id: int) -> None:
            self._ahead.trace_id = trace_id

    return RootIds


def id_generator() -> Any:
    """The id generator of the TracerProvider ``telemetry.setup`` installs."""
    return _root_ids()()


def dropped_root(provider: Any, name: str, kind: SpanKind) -> str | None:
    """The ``traceparent`` of a new trace the provider's sampler drops, for a span ``name``
    started now with no parent and nothing current; None when it keeps it (start the span:
    it takes the trace id drawn here) or when ``provider``'s ids are not :func:`id_generator`'s."""
    ids, ours = provider.id_generator, _root_ids()
    if not isinstance(ids, ours):
        return None
    trace_id = ids.draw()
    result = provider.sampler.should_sample(None, trace_id, name, kind)
    if result.decision.is_recording() or result.trace_state:
        ids.keep_for_next_root(trace_id)
        return None
    return f"00-{trace_id:032x}-{ids.generate_span_id():016x}-{ids.unsampled_flags}"
