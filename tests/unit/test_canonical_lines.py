"""Canonical lines: an unusual message in full, the routine ones counted into a summary that
is about no one message: none of the handled message's bound ids, nor its trace id."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from baton.observability import propagation
from baton.observability.canonical import CanonicalLines
from baton.observability.log import add_trace_id, get_logger

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"


def test_the_summary_names_no_trace_and_no_ids_of_the_message_in_hand() -> None:
    lines: list[dict[str, Any]] = []

    def keep(_logger: Any, _method: str, event: Any) -> Any:
        lines.append(dict(event))
        raise structlog.DropEvent

    structlog.configure(processors=[structlog.contextvars.merge_contextvars, add_trace_id,
                                    keep], cache_logger_on_first_use=False)
    try:
        canonical = CanonicalLines(get_logger("test.canonical"), "tool_message_handled",
                                   every_s=3600)
        propagation.set_incoming_trace(TRACEPARENT[3:35])  # handling a message of this trace
        structlog.contextvars.bind_contextvars(session_id="s-1", run_id="r-1")
        canonical.line(False, outcome="failed", ms=2.0)  # unusual: in full, with its trace
        canonical.line(True, outcome="ok", ms=1.0)
        canonical.line(True, outcome="ok", ms=3.0)
        canonical.flush()
    finally:
        structlog.contextvars.clear_contextvars()
        propagation.set_incoming_trace(None)
        structlog.reset_defaults()
    full, summary = (line for line in lines if line["event"] != "tool_message_handled"
                     or line.get("outcome") == "failed")
    assert full["trace_id"] == TRACEPARENT[3:35] and full["run_id"] == "r-1"
    assert summary["event"] == "tool_message_handled_summary" and summary["routine"] == 2
    assert "trace_id" not in summary and "run_id" not in summary and "session_id" not in summary
    assert summary["outcomes"] == {"ok": 2} and summary["ms_max"] == 3.0


async def test_a_burst_then_quiet_is_summarised_when_due_without_another_message() -> None:
    """The summary of a window is told every_s after its first routine message, by a timer:
    a burst followed by quiet was told only when a later message came (minutes later)."""
    told = asyncio.Event()
    lines: list[dict[str, Any]] = []

    def keep(_logger: Any, _method: str, event: Any) -> Any:
        lines.append(dict(event))
        if event["event"].endswith("_summary"):
            told.set()
        raise structlog.DropEvent

    structlog.configure(processors=[structlog.contextvars.merge_contextvars, keep],
                        cache_logger_on_first_use=False)
    try:
        canonical = CanonicalLines(get_logger("test.canonical"), "wake_handled", every_s=0.05)
        for ms in (1.0, 2.0, 4.0):
            canonical.line(True, outcome="ok", ms=ms)
        async with asyncio.timeout(30):  # a deadline for a loaded machine, not a measure
            await told.wait()
        canonical.flush()  # nothing counted since: no second summary
    finally:
        structlog.reset_defaults()
    summaries = [line for line in lines if line["event"] == "wake_handled_summary"]
    assert len(summaries) == 1 and summaries[0]["routine"] == 3
    assert summaries[0]["ms_max"] == 4.0
