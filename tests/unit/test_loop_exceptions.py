"""A connection that dies under a transport (a server node killed mid-TLS) is one WARNING
line, not the event loop's ERROR with a traceback; anything else still reaches the loop's
default handler."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from baton.service import _loop_exception


def test_a_transport_error_is_a_warning_line_and_the_rest_goes_to_the_default() -> None:
    lines: list[dict[str, Any]] = []

    def keep(_logger: Any, method: str, event: Any) -> Any:
        lines.append({**event, "level": method})
        raise structlog.DropEvent

    structlog.configure(processors=[keep], cache_logger_on_first_use=False)
    loop = asyncio.new_event_loop()
    defaults: list[dict[str, Any]] = []
    loop.default_exception_handler = defaults.append  # type: ignore[method-assign]
    try:
        _loop_exception(loop, {"message": "Fatal error on SSL protocol",
                               "exception": ConnectionResetError("reset by peer")})
        _loop_exception(loop, {"message": "Task exception was never retrieved",
                               "exception": ValueError("a bug")})
    finally:
        loop.close()
        structlog.reset_defaults()
    assert [(x["event"], x["level"]) for x in lines] == [
        ("connection_lost_under_transport", "warning")]
    assert "reset by peer" in lines[0]["error"]
    assert [d["message"] for d in defaults] == ["Task exception was never retrieved"]
