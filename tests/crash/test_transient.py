"""Transient tool failures are not final (hands.retries): a Hands frozen mid-connect.

The Hands reaches the mail service through a gate that leaves connects hanging (its accept
queue is full, so the kernel drops the SYNs). The Hands is SIGSTOPped while its connects
hang, kept stopped past the connect timeout (on Redis's clock) but within the attempt ttl,
then the gate opens and the Hands resumes: its connects time out on resume although no
request left. Each mail must be sent exactly once and the run end ok, never
``failed (tool_exception)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.crash.conftest import Crash, Opener
from tests.helpers import eventually

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]

CONNECT_TIMEOUT_S = 0.5


class ConnectGate:
    """A TCP port whose connects hang until :meth:`open`; then it forwards to ``target``."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.listener.setblocking(False)
        # Fill the accept queue: further SYNs are dropped, connects stay pending.
        self.fillers = []
        for _ in range(2):
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(self.listener.getsockname())
            self.fillers.append(s)
        self.server: asyncio.Server | None = None

    @property
    def port_of_url(self) -> int:
        return int(self.listener.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    async def open(self) -> None:
        for s in self.fillers:
            s.close()
        self.server = await asyncio.start_server(self._forward, sock=self.listener)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def close(self) -> None:
        for s in self.fillers:
            s.close()
        if self.server is not None:
            self.server.close()
        else:
            self.listener.close()


@pytest.fixture
async def gate_factory() -> AsyncIterator[list[ConnectGate]]:
    gates: list[ConnectGate] = []
    yield gates
    for g in gates:
        await g.close()


async def _all_five(claimed: Callable[[], Awaitable[list[int]]]) -> list[int] | None:
    found = await claimed()
    return found if len(found) == 5 else None


def _connecting(pid: int, port: int) -> int:
    """How many of the process's TCP sockets are connecting (SYN_SENT) to ``port``."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    count = 0
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if fields[3] == "02" and remote_port == port and fields[9] in inodes:
                    count += 1
    return count


async def _past(c: Crash, until_ms: int) -> bool:
    return await _redis_ms(c) >= until_ms


async def _redis_ms(c: Crash) -> int:
    secs, micros = await c.store.redis.time()
    return int(secs) * 1000 + int(micros) // 1000


async def test_hands_stalled_mid_connect_sends_each_mail_once(
    crash: Opener, gate_factory: list[ConnectGate]
) -> None:
    c = await crash(hands=0, env={"BATON_ATTEMPT_TTL_MS": "20000", "BATON_ACK_WAIT_S": "30"})
    gate = ConnectGate(c.stack.mail_url)
    gate_factory.append(gate)
    hands = await c.stack.spawn("hands", env={
        "BATON_MAIL_URL": gate.url, "BATON_CONNECT_TIMEOUT_S": str(CONNECT_TIMEOUT_S)})
    sub = await c.submit()

    async def claimed() -> list[int]:
        runs = await c.runs(sub.session_id)
        return [r.accepted_ms or 0 for r in runs
                if r.intent.tool == "send_email" and r.status == "running"]

    accepted = await eventually(lambda: _all_five(claimed), timeout=30, interval=0.02)
    # A run is claimed before its send connects: wait until all five connects hang (on a
    # loaded machine a send could start only after the pause, when the gate is open)
    assert hands.pid is not None
    pid, port = hands.pid, gate.port_of_url
    await eventually(lambda: _connecting(pid, port) >= 5 or None, timeout=30, interval=0.02)
    c.stack.pause(hands.name)  # every send is connecting through the closed gate
    try:
        # Past the connect timeout on Redis's clock, well within the attempt ttl.
        until = max(accepted) + int(CONNECT_TIMEOUT_S * 1000) * 3
        await eventually(lambda: _past(c, until), timeout=30, interval=0.05)
        assert (await c.stats())["raw_requests"] == 0  # nothing got through the gate
        await gate.open()
    finally:
        c.stack.resume(hands.name)
    final = await c.settle(sub)
    await c.check_completed(final)
    await c.check_exactly_once(raw_requests=5)
    runs = await c.runs(sub.session_id)
    assert all(r.result is not None and r.result.outcome == "ok" for r in runs), runs
    assert all(r.attempt == 1 for r in runs), runs  # no takeover: the same attempt retried
    assert c.events(hands.name, "request_retried"), c.tails()
