"""The spans around the work itself: a model call (:func:`traced_model`, GenAI conventions)
and deciding a tool run's result (:func:`execute`). A task's phase has its span where the
scheduler calls it (:func:`baton.brain.scheduler.advance`)."""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from opentelemetry.trace import SpanKind

from baton.observability.metrics import Instruments
from baton.observability.spans import (
    SESSION,
    enter_span,
    metric_attrs,
    recording_tracer,
)
from baton.observability.telemetry import instruments

__all__ = ["execute", "traced_model"]

T = TypeVar("T")


def _provider(name: str) -> str:
    """``gen_ai.provider.name`` from a model name ``<provider>:<model>`` (else the name)."""
    provider, sep, _model = name.partition(":")
    return provider if sep else name


class _TracedModel:
    """A model client whose ``generate`` is a CLIENT span (GenAI semantic conventions) and
    records ``gen_ai.client.operation.duration`` and ``gen_ai.client.token.usage``.

    Always wrapped, checked at each call: a provider configured after the Brain built its
    clients still sees the calls. ``generate`` keeps the wrapped one's signature
    (``functools.wraps``): the Brain looks at it to tell whether the client streams;
    everything else is the client's own.
    """

    def __init__(self, name: str, client: Any) -> None:
        self._client = client
        inner = client.generate
        provider = _provider(name)

        @functools.wraps(inner)
        async def generate(request: Any, *args: Any, **kw: Any) -> Any:
            t, inst = recording_tracer(), instruments()
            if t is None and inst is None:
                return await inner(request, *args, **kw)
            model = request.model
            started = time.perf_counter()
            error: str | None = None
            response: Any = None
            try:
                if t is None:
                    response = await inner(request, *args, **kw)
                    return response
                with enter_span(
                    t, f"chat {model}", SpanKind.CLIENT, **_gen_ai(provider, model),
                    **{"baton.request_id": request.request_id,
                       "baton.entries": len(request.entries)},
                ) as span:
                    response = await inner(request, *args, **kw)
                    span.set_attributes({
                        **_usage(response),
                        "gen_ai.response.finish_reasons": [
                            str(getattr(response, "stop_reason", ""))],
                        "baton.tool_calls": len(getattr(response, "tool_calls", ())),
                    })
                    return response
            except BaseException as exc:
                error = type(exc).__name__
                raise
            finally:
                if inst is not None:
                    _record_model(inst, provider, model, time.perf_counter() - started,
                                  response, error)

        self.generate = generate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def _usage(response: Any) -> dict[str, int]:
    usage = getattr(response, "usage", None)
    return {"gen_ai.usage.input_tokens": getattr(usage, "input_tokens", 0),
            "gen_ai.usage.output_tokens": getattr(usage, "output_tokens", 0)}


def _gen_ai(provider: str, model: str, *more: tuple[str, str]) -> dict[str, Any]:
    """The GenAI attributes of a call to ``model`` (and ``more``), made once per set."""
    return metric_attrs(("gen_ai.operation.name", "chat"), ("gen_ai.provider.name", provider),
                        ("gen_ai.system", provider), ("gen_ai.request.model", model), *more)


@functools.lru_cache(maxsize=256)
def _call_attrs(provider: str, model: str) -> tuple[dict[str, Any], dict[str, Any],
                                                   dict[str, Any]]:
    """A call's attribute sets: the duration's (no error), the input and output tokens'."""
    return (_gen_ai(provider, model), _gen_ai(provider, model, ("gen_ai.token.type", "input")),
            _gen_ai(provider, model, ("gen_ai.token.type", "output")))


def _record_model(inst: Instruments, provider: str, model: str, seconds: float, response: Any,
                  error: str | None) -> None:
    ok, tokens_in, tokens_out = _call_attrs(provider, model)
    inst.model_duration.record(seconds, _gen_ai(provider, model, ("error.type", error))
                               if error else ok)
    if response is not None:
        usage = _usage(response)
        inst.model_tokens.record(usage["gen_ai.usage.input_tokens"], tokens_in)
        inst.model_tokens.record(usage["gen_ai.usage.output_tokens"], tokens_out)


def traced_model(name: str, client: Any) -> Any:
    """The model client ``name``, wrapped so each call is a span when something records."""
    if isinstance(client, _TracedModel):
        return client
    return _TracedModel(name, client)


async def execute(intent: Any, attempt: int, call: Awaitable[T]) -> T:
    """Around deciding a tool run's result (execute, or confirm / re-execute on recovery)."""
    t = recording_tracer()
    if t is None:
        return await call
    with enter_span(t, f"execute {intent.tool}", **{
        SESSION: intent.session_id, "baton.run_id": intent.run_id,
        "baton.task_id": intent.task_id, "baton.fence": attempt,
        "baton.replay": intent.replay, "baton.operation_id": intent.operation_id,
    }) as span:
        result: Any = await call
        if result is not None:
            span.set_attributes({"baton.outcome": result.outcome,
                                 "baton.recovery": result.recovery})
        return result
