"""Tools declared ``isolation="process"``, for tests/integration/test_isolation.py.

They live in a small module of their own because each call imports this module again in a
fresh child process (``python -m baton.hands.isolated``).
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
import time
from typing import Any

from pydantic import BaseModel

from baton.app import Tool, ToolContext, tool


class Target(BaseModel):
    host: str = "127.0.0.1"
    port: int = 0


class Nothing(BaseModel):
    text: str = ""


@tool(isolation="process", env={"ALLOWED": "declared"}, memory_mb=256, wall_time_s=30)
async def snoop(args: Target, ctx: ToolContext) -> dict[str, Any]:
    """What a hostile tool can find: its environment, argv, open descriptors, and what the
    worker's Redis says to a connection without the worker's password."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError as exc:  # the descriptor of the listing itself, closed by now
            fds[fd] = f"gone: {exc.strerror}"
            continue
        if target.startswith("socket:"):  # which kind: the event loop's own pair is AF_UNIX
            with socket.socket(fileno=os.dup(int(fd))) as sock:
                target = f"{target} {sock.family.name}"
        fds[fd] = target
    with socket.create_connection((args.host, args.port), timeout=5) as conn:
        conn.sendall(b"PING\r\n")
        reply = conn.recv(256).decode(errors="replace")
    return {"env": dict(os.environ), "argv": sys.argv, "fds": fds, "ping": reply,
            "settings_redis": ctx.settings.redis_url}


@tool(isolation="process", memory_mb=64, wall_time_s=60)
async def hog(args: Nothing, ctx: ToolContext) -> int:
    """Allocates without bound."""
    held = []
    while True:
        held.append(bytearray(8 * 1024 * 1024))


@tool(isolation="process", wall_time_s=1)
async def hang(args: Nothing, ctx: ToolContext) -> None:
    """Blocks its process (not even cancellable) far past its wall time."""
    time.sleep(3600)  # noqa: ASYNC251 - a tool that blocks is what is tested


@tool(isolation="process")
async def segfault(args: Nothing, ctx: ToolContext) -> None:
    """Dies on a null pointer read."""
    ctypes.string_at(0)


@tool(isolation="process")
async def bail(args: Nothing, ctx: ToolContext) -> None:
    """Exits with status 1 before answering."""
    print("bailing out", file=sys.stderr)
    os._exit(1)


@tool(isolation="process", env={"GREETING": "hello"})
async def greet(args: Nothing, ctx: ToolContext) -> dict[str, str]:
    """A well-behaved isolated tool; its prints must not corrupt its answer."""
    print("noise on stdout")
    return {"greeting": f"{os.environ['GREETING']} {args.text}"}


async def _shout(args: Nothing, ctx: ToolContext) -> str:
    return args.text.upper()


# Declared by hand rather than by the decorator: the child finds it by its function.
shout = Tool(_shout, name="shout", isolation="process")
