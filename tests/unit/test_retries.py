"""hands.retries: what each error proves, and the tool-level retry loop."""

from __future__ import annotations

import aiohttp
import httpx
import pytest

from baton.hands import retries
from baton.hands.retries import call_with_retries, classify


class Flaky(Exception):
    pass


def _mapped(original: Exception, mapped: type[Exception]) -> Exception:
    """An error as httpx_aiohttp raises it: mapped, with the aiohttp one as its cause."""
    try:
        raise mapped(str(original)) from original
    except Exception as exc:
        return exc


def test_classify() -> None:
    assert classify(httpx.ConnectError("refused")) == "never_sent"
    assert classify(httpx.ConnectTimeout("slow")) == "never_sent"
    assert classify(ConnectionRefusedError()) == "never_sent"
    assert classify(httpx.ReadTimeout("slow")) == "ambiguous"
    assert classify(ValueError("bug")) == "final"
    assert classify(Flaky(), (Flaky,)) == "declared"
    # httpx_aiohttp maps a disconnect after sending to ConnectTimeout: the cause decides.
    assert classify(_mapped(aiohttp.ServerDisconnectedError(), httpx.ConnectTimeout)) \
        == "ambiguous"
    assert classify(_mapped(aiohttp.ConnectionTimeoutError(), httpx.ConnectTimeout)) \
        == "never_sent"


async def test_declared_error_is_retried_within_the_deadline() -> None:
    calls = 0

    async def call() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise Flaky()
        return "ok"

    assert await call_with_retries(call, timeout=10, replay="unsafe", retry_on=(Flaky,),
                                   confirm=None) == ("ok", False)
    assert calls == 3


async def test_ambiguous_failure_confirms_before_resending() -> None:
    sent = []

    async def call() -> str:
        sent.append(1)
        raise httpx.ReadTimeout("no answer")

    async def confirm() -> str:
        return "found"

    assert await call_with_retries(call, timeout=10, replay="confirm", retry_on=(),
                                   confirm=confirm) == ("found", True)
    assert sent == [1]


async def test_unsafe_tool_is_not_rerun_after_connect_failure() -> None:
    async def call() -> str:
        raise httpx.ConnectError("refused")

    with pytest.raises(httpx.ConnectError):
        await call_with_retries(call, timeout=10, replay="unsafe", retry_on=(), confirm=None)


async def test_no_retry_past_the_deadline() -> None:
    calls = 0

    async def call() -> str:
        nonlocal calls
        calls += 1
        raise Flaky()

    with pytest.raises(Flaky):
        await call_with_retries(call, timeout=0.01, replay="safe", retry_on=(Flaky,),
                                confirm=None)
    assert calls == 1
    assert retries.deadline.get() is None  # set only inside the call's own context
