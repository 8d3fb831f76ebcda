"""structlog configuration, done once per process by Baton's own entry point.

JSON lines when stderr is not a terminal (services, CI), a readable console otherwise.
Ids of the message being handled are bound with contextvars at the message boundary, so
every line logged while handling it carries them (``session_id``, ``task_id``, ``run_id``,
``fence``); ``trace_id`` is added to each line from the current span (or, in a process that
does not trace, from the handled message's ``traceparent``: :mod:`baton.observability.telemetry`).

The standard library's records (asyncio, nats, redis, aiohttp, OpenTelemetry's exporters,
``warnings.warn``) go through the same processors and renderer, by a
``structlog.stdlib.ProcessorFormatter`` on one root handler: a service's stderr is JSON
lines only. :func:`configure` is called by the ``baton`` commands alone; an application
that embeds Baton keeps its own logging configuration untouched.

Baton's modules log through :func:`get_logger`. Once structlog is configured (by
:func:`configure`, or by an application that uses structlog itself) that is structlog's
configured logger. Until then, Baton's lines go to the standard library logger of the same
name (``baton.brain``, ``baton.store.epoch`` ...) with their fields in ``extra``, so an
application that only uses :mod:`logging` decides their level and handlers, and nothing is
printed to its stdout (unconfigured structlog would print every line there).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson
import structlog

from baton.observability.propagation import current_trace_id

# Library records below this level stay out (aiohttp's access log is INFO per request).
LIBRARY_LEVEL = logging.WARNING

# Free text that came from outside (a wake's reason, a tool's error, a model's error body, a
# Redis or NATS error reply) is cut to this many characters in a log line: one field once
# made a 500 KB line, which log pipelines drop or split.
MAX_LOG_TEXT = 2_000


def bounded(value: object, limit: int = MAX_LOG_TEXT) -> str:
    """``value`` as text of at most about ``limit`` characters, marked when cut.

    Use it on every free-text field that came from the wire or Redis before it reaches a log
    line. The marker keeps the original length, so a reader knows what was left out.
    """
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [truncated: {len(text)} chars]"


def error_text(exc: BaseException) -> str:
    """An error for a log line: its type and message (``repr`` of some redis-py errors is
    only ``server:ResponseError``, without the message), bounded."""
    text = str(exc)
    return bounded(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def bound_long_strings(
    logger: object, method: str, event: structlog.types.EventDict
) -> structlog.types.EventDict:
    """structlog processor: the backstop for a field no call site bounded.

    Cuts any string value longer than four times :data:`MAX_LOG_TEXT` (the call sites bound
    to :data:`MAX_LOG_TEXT`; a traceback from ``format_exc_info`` may be longer and is kept
    up to this backstop).
    """
    limit = 4 * MAX_LOG_TEXT
    for key, value in event.items():
        if isinstance(value, str) and len(value) > limit:
            event[key] = bounded(value, limit)
    return event


class _BatonHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The root handler :func:`configure` installs; found again and replaced on a second call.

    Writes to whatever ``sys.stderr`` is when a record comes (a redirected stderr included),
    like structlog's own loggers.
    """

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def configure(level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog, and route the standard library's logging through it."""
    json_out = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    processors: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        add_trace_id,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        bound_long_strings,
    ]
    wrapper = structlog.make_filtering_bound_logger(numeric)
    if json_out:  # the hot path of every service: orjson straight to the byte stream
        structlog.configure(
            processors=[*processors, structlog.processors.JSONRenderer(serializer=orjson.dumps)],
            wrapper_class=wrapper,
            logger_factory=structlog.BytesLoggerFactory(file=sys.stderr.buffer),
            cache_logger_on_first_use=True,
        )
        renderer: structlog.types.Processor = structlog.processors.JSONRenderer(
            serializer=_json_text)
    else:
        structlog.configure(
            processors=[*processors, structlog.dev.ConsoleRenderer()],
            wrapper_class=wrapper,
            logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
            cache_logger_on_first_use=True,
        )
        renderer = structlog.dev.ConsoleRenderer()
    _route_stdlib(processors, renderer, max(numeric, LIBRARY_LEVEL))


def _route_stdlib(processors: list[structlog.types.Processor],
                  renderer: structlog.types.Processor, level: int) -> None:
    """One root handler rendering stdlib records like structlog's own lines."""
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name,
                           structlog.stdlib.ExtraAdder(), *processors],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = _BatonHandler()
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _BatonHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)  # warnings.warn(...) becomes a record, hence a line


class BatonLogger:
    """A structlog-style logger (``info``, ``warning``, ``bind`` ...) that follows whoever
    configures logging: see the module docstring."""

    __slots__ = ("_context", "_name", "_target")

    def __init__(self, name: str, context: dict[str, Any] | None = None) -> None:
        self._name = name
        self._context = context or {}
        self._target: Any = None  # structlog's logger, once structlog is configured

    def bind(self, **values: Any) -> BatonLogger:
        return BatonLogger(self._name, {**self._context, **values})

    def new(self, **values: Any) -> BatonLogger:
        return BatonLogger(self._name, values)

    def _resolve(self) -> Any:
        if self._target is not None:
            return self._target
        if structlog.is_configured():
            self._target = structlog.get_logger(self._name).bind(**self._context)
            return self._target
        return _stdlib_logger(self._name).bind(**self._context)

    def __getattr__(self, method: str) -> Any:
        return getattr(self._resolve(), method)


def _stdlib_logger(name: str) -> Any:
    """A structlog logger writing to ``logging.getLogger(name)``, its fields as ``extra``;
    its own processors, so structlog's global configuration stays the application's."""
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=[structlog.contextvars.merge_contextvars, add_trace_id,
                    structlog.stdlib.filter_by_level, _to_log_call],
        wrapper_class=structlog.stdlib.BoundLogger,
    )


#: LogRecord attributes a field must not overwrite (logging raises KeyError on them).
_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message"}


def _to_log_call(logger: object, method: str, event: structlog.types.EventDict
                 ) -> dict[str, Any]:
    """The keyword arguments of the stdlib call: ``event k=v ...`` as the message, so a plain
    formatter shows the fields too, and every field in ``extra`` for structured handlers."""
    name = str(event.pop("event", ""))
    exc_info = event.pop("exc_info", None)
    fields = " ".join(f"{k}={v!r}" for k, v in event.items())
    extra = {f"baton_{k}" if k in _RESERVED else k: v for k, v in event.items()}
    return {"msg": f"{name} {fields}" if fields else name, "extra": extra,
            "exc_info": exc_info}


def get_logger(name: str) -> BatonLogger:
    """The logger Baton's modules use (``log = get_logger("baton.relay")``)."""
    return BatonLogger(name)


def _json_text(obj: object, **kw: object) -> str:
    return orjson.dumps(obj).decode()


def add_trace_id(
    logger: object, method: str, event: structlog.types.EventDict
) -> structlog.types.EventDict:
    """structlog processor: the trace the line belongs to, when there is one. A line given
    ``trace_id=None`` is about no one message (a summary) and gets none."""
    if "trace_id" not in event:
        trace_id = current_trace_id()
        if trace_id is not None:
            event["trace_id"] = trace_id
    elif event["trace_id"] is None:
        del event["trace_id"]
    return event


def bind(**ids: object) -> None:
    """Bind ids for every log line of the current task (contextvars)."""
    structlog.contextvars.bind_contextvars(**{k: v for k, v in ids.items() if v is not None})


def clear() -> None:
    structlog.contextvars.clear_contextvars()
