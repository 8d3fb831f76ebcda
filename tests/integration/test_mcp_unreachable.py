"""An MCP server that cannot start says why, not which task group wrapped the error."""

from __future__ import annotations

import sys

import pytest

from baton.mcp.connection import MCPConnection, MCPServerUnavailable, innermost


def test_innermost_unwraps_groups_of_one() -> None:
    cause = ValueError("the real reason")
    nested = BaseExceptionGroup("outer", [ExceptionGroup("inner", [cause])])
    assert innermost(nested) is cause
    two = ExceptionGroup("two", [cause, KeyError("k")])
    assert innermost(two) is two  # several causes: the group says so itself


async def test_a_stdio_server_that_exits_at_once_is_unreachable_with_its_cause() -> None:
    conn = MCPConnection("gone", command=[sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(MCPServerUnavailable) as caught:
        await conn.client()
    text = str(caught.value)
    assert text.startswith("MCP server gone (") and "cannot be reached: " in text
    assert "TaskGroup" not in text and "ExceptionGroup" not in text, text
    await conn.close()
