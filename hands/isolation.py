"""Process isolation for tools declared ``isolation="process"``: the parent side.

A Hands worker holds credentials that let it write tool-run records; the tools it runs are
the least trusted code of the system (interpreters, browsers, third-party clients). A tool
declared with process isolation runs each call in a fresh child
(``python -m baton.hands.isolated``, see there for the protocol) that gets:

- only the environment the tool declares (``env=``): no ``BATON_*`` variables, no URLs,
  no passwords; nothing secret in its argv either (the request travels on stdin);
- no file descriptors but stdin, stdout and stderr (``close_fds``), so no inherited Redis or
  NATS socket;
- an address-space limit (``memory_mb``, RLIMIT_AS set in the child) and a wall-time limit
  (``wall_time_s``; the child's process group is killed when it passes).

Its crash, hang or memory blow-up becomes a :class:`~baton.errors.ToolError` with code
``tool_crashed``, ``tool_timeout`` or ``tool_memory_limit``: a result of that attempt (the
replay policy decides what happens next), never the worker's end. The parent keeps
heartbeating the attempt meanwhile (:meth:`~baton.hands.execute.ToolExecution._supervised`
runs this like any tool call) and kills the child when the attempt is cancelled or lost.

What this does not do: the child runs as the worker's user, so it can read any file the
worker can (a NATS credentials file, TLS keys, a mounted .env) and, unless the worker is
non-dumpable (:func:`harden_worker`, called by ``baton hands`` when it serves an isolated
tool), the worker's ``/proc/<pid>/environ``; root in the child bypasses both. For a hard
boundary run the Hands as an unprivileged user whose credentials live only in its
environment, or give tools their own user and namespaces at the container level.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
from typing import Any

import orjson
from pydantic import BaseModel

from baton.app import Tool, ToolContext
from baton.errors import ToolError
from baton.observability.log import bounded, get_logger

__all__ = ["harden_worker", "run_isolated"]

log = get_logger("baton.hands")

STDERR_TAIL = 4_096  # bytes of the child's stderr kept for a crash report
ANSWER_SLACK = 64 * 1024  # an answer may exceed the payload limit by this before it is cut off
PR_SET_DUMPABLE = 4
EXIT_MEMORY = 3  # the child's status when the tool ran out of memory (baton.hands.isolated)


def harden_worker() -> None:
    """Make this process non-dumpable: a same-user child can no longer read its
    ``/proc/<pid>/environ`` or ``/proc/<pid>/mem``, nor attach to it (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


async def run_isolated(
    tool: Tool, call: str, args: BaseModel, ctx: ToolContext, *, max_answer: int
) -> Any:
    """Run ``tool`` (``call`` = "tool" or "confirm") once in a child; its output, or a
    :class:`ToolError` saying why there is none."""
    request = orjson.dumps({
        "v": 1, "target": tool.target, "call": call,
        "arguments": args.model_dump(mode="json"),
        "ctx": {"session_id": ctx.session_id, "run_id": ctx.run_id,
                "operation_id": ctx.operation_id, "attempt": ctx.attempt},
        "sys_path": [p for p in sys.path if p],
        "memory_mb": tool.memory_mb,
    })
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "baton.hands.isolated",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=dict(tool.env), close_fds=True,
        start_new_session=True,  # its own process group: a kill reaches what it spawned
    )
    try:
        async with asyncio.timeout(tool.wall_time_s) as deadline:
            answer, tail = await _exchange(proc, request, max_answer + ANSWER_SLACK)
            code = await proc.wait()
    except TimeoutError:
        if deadline.expired():
            raise ToolError(f"{tool.name} did not finish within its wall time of "
                            f"{tool.wall_time_s:g}s and was killed", "tool_timeout") from None
        raise
    finally:
        if proc.returncode is None:  # deadline, cancellation (taken over, cancelled), error
            _kill(proc)
            with contextlib.suppress(ProcessLookupError):
                await proc.wait()
    return _outcome(tool, answer, tail, code)


async def _exchange(
    proc: asyncio.subprocess.Process, request: bytes, limit: int
) -> tuple[bytes, bytes]:
    """Send the request, read the answer (at most ``limit`` bytes) and the stderr tail."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdout, stderr = proc.stdout, proc.stderr

    async def answer() -> bytes:
        chunks: list[bytes] = []
        size = 0
        while chunk := await stdout.read(65536):
            size += len(chunk)
            if size > limit:
                raise ToolError(f"the isolated tool answered more than {limit} bytes",
                                "tool_output_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    async def tail() -> bytes:
        kept = b""
        while chunk := await stderr.read(65536):
            kept = (kept + chunk)[-STDERR_TAIL:]
        return kept

    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.write(request)
        await proc.stdin.drain()
        proc.stdin.close()
    reading = asyncio.gather(answer(), tail())
    try:
        got_answer, got_tail = await reading
    except BaseException:
        reading.cancel()
        raise
    return got_answer, got_tail


def _outcome(tool: Tool, answer: bytes, tail: bytes, code: int) -> Any:
    """The tool's output from the child's answer and exit status, or the ToolError."""
    reply: dict[str, Any] | None = None
    if answer:
        with contextlib.suppress(orjson.JSONDecodeError):
            decoded = orjson.loads(answer)
            reply = decoded if isinstance(decoded, dict) else None
    if reply is not None and reply.get("ok") is True and code == 0:
        return reply.get("output")
    if reply is not None and reply.get("ok") is False:
        raise ToolError(bounded(reply.get("message", "")), str(reply.get("code", "tool_error")))
    if code == EXIT_MEMORY:
        raise ToolError(f"{tool.name} exceeded its memory limit of {tool.memory_mb} MB",
                        "tool_memory_limit")
    how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 and \
        -code in signal.valid_signals() else f"exited with status {code}"
    stderr = tail.decode(errors="replace").strip()
    log.warning("isolated_tool_crashed", status=code, stderr=bounded(stderr, 1000))
    raise ToolError(f"{tool.name} {how} without an answer"
                    + (f"; its last output: {bounded(stderr, 500)}" if stderr else ""),
                    "tool_crashed")


def _kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the child's process group (the child and whatever it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
