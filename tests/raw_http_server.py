"""A raw HTTP/1.1 server on a free port whose answers each test scripts byte for byte,
hostile ones included: a head or body that never ends, a slow drip, a reset mid-answer.

For each request on a connection (its head, and its body by Content-Length, are read whole)
``script(head, n)`` says what to send: an :class:`Answer`, or None to close without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Answer", "RawServer", "Script", "ok", "raw_server"]

#: How long a dripping answer waits between its bytes: the drip is the server's behaviour
#: under test (a client's deadline must end it), not a wait for something to happen.
DRIP_S = 0.02


Then = Literal["keep", "close", "reset", "stall"]


@dataclass(frozen=True)
class Answer:
    """What the server sends for one request: ``data``, then ``endless`` over and over until
    the client goes (if any), then ``drip`` a byte at a time (if any, for ever), then
    ``then``: serve the connection's next request (``keep``), ``close`` it, ``reset`` it
    (a TCP RST), or ``stall`` (send nothing more; the connection ends when the client
    closes it)."""

    data: bytes = b""
    endless: bytes = b""
    drip: bytes = b""
    then: Then = "keep"

    def __repr__(self) -> str:  # a failing example's report stays readable
        return (f"Answer({len(self.data)} bytes {self.data[:160]!r}..., "
                f"endless={self.endless[:40]!r}, drip={self.drip[:40]!r}, then={self.then!r})")


Script = Callable[[bytes, int], Answer | None]  # (request head, index from 1) -> answer


def ok(body: bytes = b"hello", extra: bytes = b"", then: Then = "keep") -> Answer:
    """A 200 answer with a Content-Length (``extra``: header lines, each ending CRLF)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (len(body), extra)
    return Answer(head + body, then=then)


@dataclass
class RawServer:
    """Counts connections and keeps each request (head and body) as read."""

    script: Script
    url: str = ""
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    hold: asyncio.Event | None = None  # while set to an unset event, requests wait
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                if self.hold is not None:
                    await self.hold.wait()
                answer = self.script(head, len(self.requests))
                if answer is None:
                    break
                if not await self._send(answer, reader, writer):
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # the client went, or the test ended the connection
        finally:
            writer.close()
            self._writers.discard(writer)
            self._tasks.discard(task)

    async def _send(self, answer: Answer, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> bool:
        """Send ``answer``; whether the connection serves another request."""
        writer.write(answer.data)
        await writer.drain()
        endless = answer.endless * max(1, 65536 // max(1, len(answer.endless)))
        while answer.endless:
            writer.write(endless)
            await writer.drain()  # raises once the client has gone
            await asyncio.sleep(0)  # drain only yields when the client reads slower
        for byte in _forever(answer.drip):
            writer.write(byte)
            await writer.drain()
            await asyncio.sleep(DRIP_S)
        if answer.then == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        if answer.then == "stall":
            await reader.read()  # until the client closes the connection
            return False
        return answer.then == "keep"

    def unsent(self) -> int:
        """Bytes the server wrote that its sockets have not taken yet: more than 0 once a
        client that stopped reading has let the kernel's buffers fill (back-pressure)."""
        return sum(w.transport.get_write_buffer_size() for w in self._writers)

    async def stop(self) -> None:
        """End every connection (a hostile answer may still be sending) and its handler."""
        if self.hold is not None:
            self.hold.set()
        for writer in list(self._writers):
            writer.transport.abort()  # the handler's next read, write or drain ends it
        if self._tasks:
            await asyncio.wait(self._tasks)


def _forever(drip: bytes) -> Iterator[bytes]:
    """The bytes of ``drip`` one at a time, over and over (nothing for none)."""
    while drip:
        for i in range(len(drip)):
            yield drip[i:i + 1]


@contextlib.asynccontextmanager
async def raw_server(script: Script) -> AsyncIterator[RawServer]:
    raw = RawServer(script)
    server = await asyncio.start_server(raw.serve, "127.0.0.1", 0)
    raw.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield raw
    finally:
        server.close()
        await raw.stop()
        await server.wait_closed()
