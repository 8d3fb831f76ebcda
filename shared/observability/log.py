"""structlog configuration, done once per process by its entry point.

JSON lines when stderr is not a terminal (services, CI), a readable console otherwise.
Ids of the message being handled are bound with contextvars at the message boundary, so
every line logged while handling it carries them (``session_id``, ``task_id``, ``run_id``,
``fence``); ``trace_id`` is added to each line from the current span (or, in a process that
does not trace, from the handled message's ``traceparent``: :mod:`baton.observability.telemetry`).
"""

from __future__ import annotations

import logging
import sys

import orjson
import structlog

from baton.observability.telemetry import current_trace_id


def configure(level: str = "info", fmt: str = "auto") -> None:
    json_out = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    processors: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        add_trace_id,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    wrapper = structlog.make_filtering_bound_logger(
        logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    )
    if json_out:  # the hot path of every service: orjson straight to the byte stream
        structlog.configure(
            processors=[*processors, structlog.processors.JSONRenderer(serializer=orjson.dumps)],
            wrapper_class=wrapper,
            logger_factory=structlog.BytesLoggerFactory(file=sys.stderr.buffer),
            cache_logger_on_first_use=True,
        )
    else:
        structlog.configure(
            processors=[*processors, structlog.dev.ConsoleRenderer()],
            wrapper_class=wrapper,
            logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
            cache_logger_on_first_use=True,
        )


def add_trace_id(
    logger: object, method: str, event: structlog.types.EventDict
) -> structlog.types.EventDict:
    """structlog processor: the trace the line belongs to, when there is one."""
    if "trace_id" not in event:
        trace_id = current_trace_id()
        if trace_id is not None:
            event["trace_id"] = trace_id
    return event


def bind(**ids: object) -> None:
    """Bind ids for every log line of the current task (contextvars)."""
    structlog.contextvars.bind_contextvars(**{k: v for k, v in ids.items() if v is not None})


def clear() -> None:
    structlog.contextvars.clear_contextvars()
