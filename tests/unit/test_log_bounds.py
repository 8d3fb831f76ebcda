"""Free text from the wire or Redis is bounded before it reaches a log line."""

from __future__ import annotations

from baton.observability.log import MAX_LOG_TEXT, bound_long_strings, bounded


def test_bounded_cuts_long_text_with_a_marker_naming_its_length() -> None:
    assert bounded("short") == "short"
    assert bounded(ValueError("boom")) == "boom"
    reason = "x" * 500_000  # a wake's reason once made a 500 KB log line
    cut = bounded(reason)
    assert len(cut) < MAX_LOG_TEXT + 50
    assert cut.endswith("... [truncated: 500000 chars]")
    assert bounded("abcdef", 3) == "abc... [truncated: 6 chars]"


def test_the_log_processor_bounds_any_field_no_call_site_bounded() -> None:
    event = {"event": "wake_handled", "reason": "r" * 100_000, "n": 3, "short": "ok"}
    out = bound_long_strings(None, "info", event)
    assert len(out["reason"]) < 4 * MAX_LOG_TEXT + 50 and "[truncated" in out["reason"]
    assert out["n"] == 3 and out["short"] == "ok"


def test_an_error_in_a_log_line_keeps_its_message() -> None:
    """redis-py's repr() of a server error is only ``server:ResponseError``: a relay stalled
    by a WRONGTYPE logged that, 90 times, without the reason or the key."""
    from redis.exceptions import ResponseError

    from baton.observability.log import error_text

    wrong = ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
    assert error_text(wrong) == f"ResponseError: {wrong}"
    assert error_text(TimeoutError()) == "TimeoutError"
    assert error_text(ValueError("x" * 5000)).endswith("chars]")
