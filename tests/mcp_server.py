"""An MCP server for the tests (the SDK's MCPServer, formerly FastMCP).

    python -m tests.mcp_server STATE_DIR            stdio
    python -m tests.mcp_server STATE_DIR PORT       streamable HTTP on 127.0.0.1:PORT

Every call appends its tool's name to STATE_DIR/calls (what the outside world saw).
``flaky``, ``flaky_unsafe`` and ``flaky_confirm`` kill the server mid-call the first time (a
marker file remembers it across restarts; ``flaky_confirm`` after writing its effect file);
``slow`` writes STATE_DIR/slow-started and waits until STATE_DIR/release exists.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

STATE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
server = MCPServer("calc")


def _called(name: str) -> None:
    with (STATE / "calls").open("a") as f:
        f.write(name + "\n")


def _die_once(name: str) -> None:
    marker = STATE / f"{name}-died"
    if not marker.exists():
        marker.touch()
        os._exit(3)


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    _called("add")
    return a + b


@server.tool()
def note(text: str) -> str:
    """Write a note (an outside effect)."""
    _called("note")
    return f"noted {text}"


@server.tool()
def wipe(disk: str) -> str:
    """Wipe a disk."""
    _called("wipe")
    return f"wiped {disk}"


@server.tool()
def flaky(x: int) -> int:
    """Double x (the server dies during the first call ever)."""
    _called("flaky")
    _die_once("flaky")
    return 2 * x


@server.tool()
def flaky_unsafe(x: int) -> int:
    """Triple x (the server dies during the first call ever)."""
    _called("flaky_unsafe")
    _die_once("flaky_unsafe")
    return 3 * x


@server.tool()
def flaky_confirm(x: int) -> int:
    """Square x (the server dies during the first call ever, after the effect)."""
    _called("flaky_confirm")
    (STATE / f"effect-{x}").write_text(str(x * x))
    _die_once("flaky_confirm")
    return x * x


@server.tool()
async def slow(x: int) -> int:
    """Return x once released."""
    _called("slow")
    (STATE / "slow-started").touch()
    # The release comes from another process (the test) as a file: poll it.
    while not (STATE / "release").exists():  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    return x


if __name__ == "__main__":
    if len(sys.argv) > 2:
        server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
