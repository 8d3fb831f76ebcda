"""Tools declared ``isolation="process"``, for tests/integration/test_isolation.py.

They live in a small module of their own because each call imports this module again in a
fresh child process (``python -m baton.hands.isolated``).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import subprocess
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


@tool(isolation="process", env={"ALLOWED": "declared"}, memory_mb=256, wall_time_s=30,
      network=True)
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


# ---------------------------------------------------------------- what one child tries on others

#: The environment of ``holder``: what ``reader``, run beside it, must not find.
HELD_SECRET = "held-secret-4c1d0f"
PR_GET_DUMPABLE = 3
MNT_DETACH = 2


class Module(BaseModel):
    name: str
    source: str


class Pid(BaseModel):
    pid: int


class Marker(BaseModel):
    marker: str


class Paths(BaseModel):
    paths: list[str]
    #: Mount points to unmount first (what covers the worker's secrets, say).
    unmount: list[str] = []


@tool(isolation="process")
async def plant(args: Module, ctx: ToolContext) -> dict[str, Any]:
    """Writes a Python module into its working directory, for later children to import."""
    return _plant(args)


def _plant(args: Module) -> dict[str, Any]:  # blocking calls: the child's own loop only
    with open(f"{args.name}.py", "w") as module:
        module.write(args.source)
    return {"cwd": os.getcwd(), "wrote": os.path.exists(f"{args.name}.py")}


@tool(isolation="process", env={"HELD_SECRET": HELD_SECRET}, wall_time_s=60)
async def holder(args: Nothing, ctx: ToolContext) -> str:
    """Holds a secret in its environment until SIGUSR1 (sent by the test once it is done)."""
    released = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, released.set)
    await released.wait()
    return "released"


@tool(isolation="process")
async def reader(args: Pid, ctx: ToolContext) -> dict[str, Any]:
    """Reads another process's environment: by the pid it is given, and any it can list;
    says which processes it can see."""
    return _read_environs(args.pid)


def _read_environs(given: int) -> dict[str, Any]:
    """The given pid's environment (or why not), the pids listed, those whose environment
    holds the secret."""
    listed = sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int)
    leaked = []
    given_environ = ""
    for pid in {str(given), *listed}:
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                text = environ.read().decode(errors="replace")
        except OSError as exc:
            text = f"refused: {exc.strerror}"
        if HELD_SECRET in text:
            leaked.append(pid)
        if pid == str(given):
            given_environ = text
    libc = ctypes.CDLL(None, use_errno=True)
    return {"given": given_environ[:2000], "listed": [int(p) for p in listed][:100],
            "self": os.getpid(), "leaked": leaked,
            "uid": os.getuid(), "dumpable": libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)}


GRANDCHILD = ("import os, sys, time; os.setsid(); os.write(int(sys.argv[1]), b'up'); "
              "time.sleep(3600)")


@tool(isolation="process", wall_time_s=8)
async def escape(args: Marker, ctx: ToolContext) -> None:
    """Starts a grandchild that leaves the process group (setsid) and sleeps; then hangs past
    its wall time."""
    _escape(args.marker)


def _escape(marker: str) -> None:
    ready, up = os.pipe()
    subprocess.Popen([sys.executable, "-c", GRANDCHILD, str(up), marker], pass_fds=(up,))
    os.close(up)
    os.read(ready, 2)  # the grandchild is in its own session by now
    time.sleep(3600)


async def _dial(args: Target, ctx: ToolContext) -> str:
    try:
        with socket.create_connection((args.host, args.port), timeout=10):
            return "connected"
    except OSError as exc:
        return f"refused: {type(exc).__name__}: {exc}"


async def _dial_out(args: Target, ctx: ToolContext) -> str:
    return await _dial(args, ctx)


# The same connection, by a tool without network and by one that declares it.
dial = Tool(_dial, name="dial", isolation="process")
dial_out = Tool(_dial_out, name="dial_out", isolation="process", network=True)


@tool(isolation="process")
async def peek(args: Paths, ctx: ToolContext) -> dict[str, str]:
    """Unmounts what it is told to, then reads files the worker can read: what each holds,
    or why not."""
    return _peek(args.paths, args.unmount)


def _peek(paths: list[str], unmount: list[str]) -> dict[str, str]:
    libc = ctypes.CDLL(None, use_errno=True)
    seen = {}
    for point in unmount:
        if libc.umount2(os.fsencode(point), MNT_DETACH) != 0:
            seen[f"umount {point}"] = f"refused: {os.strerror(ctypes.get_errno())}"
        else:
            seen[f"umount {point}"] = "unmounted"
    for path in paths:
        try:
            with open(path) as file:
                seen[path] = file.read()
        except OSError as exc:
            seen[path] = f"refused: {exc.strerror}"
    return seen
