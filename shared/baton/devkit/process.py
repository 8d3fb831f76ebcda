"""One child server process, as the private servers of :mod:`baton.devkit.servers` run it:
spawned on a free loopback port (retried on a bind conflict), ready when the server itself
says so (polled with a deadline), stopped by its own PID (SIGTERM, then SIGKILL after a
timeout), SIGKILLed for crash tests and restarted on the same port and data directory."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType
from typing import Self

from baton.devkit.tls import TlsFiles
from baton.errors import ServerBinaryMissing, ServerError

__all__ = ["Managed", "ServerProcess", "find_binary", "free_port", "port_conflict"]

READY_TIMEOUT_S = 10.0
POLL_S = 0.005
PORT_ATTEMPTS = 5


def port_conflict(exc: BaseException) -> bool:
    """Whether a server's start failed because a port it was given is taken."""
    text = str(exc)
    return isinstance(exc, ServerError) and ("in use" in text.lower() or "no free port" in text)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (callers retry on conflict)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Managed(ABC):
    """A group of servers used as ``async with``: a start that fails part-way stops what it
    started, so a test or a dev stack never leaves processes behind."""

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self, timeout: float = 5.0) -> None: ...  # noqa: ASYNC109

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


class ServerProcess:
    """One child server process: spawn, readiness, stop, kill, restart."""

    name = "server"
    log_name = "server.log"
    #: The address the server binds and is reached at, and the argv prefix it is spawned
    #: with: set before start to run it inside a network namespace (baton.devkit.netns).
    host = "127.0.0.1"
    wrapper: tuple[str, ...] = ()

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        durable: bool = False,
        port: int | None = None,
        binary: str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.durable = durable
        self.tls = tls
        self._fixed_port = port is not None
        self._port = port or 0
        self._binary = self._locate(binary)  # before mkdtemp: a missing binary leaks nothing
        self._owns_dir = data_dir is None
        tmp = data_dir or Path(tempfile.mkdtemp(prefix=f"baton-{self.name}-"))
        self._data_dir = tmp.resolve()
        self._proc: subprocess.Popen[bytes] | None = None

    # -- subclass hooks ---------------------------------------------------------------------
    def _locate(self, explicit: str | None) -> str:
        raise NotImplementedError

    def _argv(self) -> list[str]:
        raise NotImplementedError

    async def _probe(self) -> bool:
        """True once the server answers like a ready server."""
        raise NotImplementedError

    def _probe_tls(self) -> ssl.SSLContext | None:
        """The TLS context the readiness probe connects with (None: plain TCP)."""
        return None

    def _pick_ports(self) -> None:
        """Choose the server's other ports again before a start attempt (a port chosen
        earlier may have been taken meanwhile); only the main port by default."""

    def _env(self) -> dict[str, str] | None:
        """The process's environment (None: this process's own)."""
        return None

    # -- public surface ---------------------------------------------------------------------
    @property
    def url(self) -> str:
        raise NotImplementedError

    @property
    def port(self) -> int:
        return self._port

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The code the process exited with on its own (reaped), else None: still running,
        never started, or stopped by :meth:`stop` / :meth:`kill`."""
        return self._proc.poll() if self._proc is not None else None

    async def start(self) -> None:
        """Start the process and return once it serves; retry other ports on a bind conflict."""
        if self.running:
            return
        self._data_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(PORT_ATTEMPTS):
            if not self._fixed_port:
                self._port = free_port()
                self._pick_ports()
            self._spawn()
            exited = await self._wait_ready()
            if not exited:
                return
            tail = self._log_tail()
            if self._fixed_port or "in use" not in tail.lower():
                raise ServerError(
                    f"{self.name} exited during start (port {self._port}):\n{tail}",
                    server=self.name, port=self._port,
                )
        raise ServerError(f"{self.name}: no free port after {PORT_ATTEMPTS} attempts")

    # `timeout` is the SIGTERM grace period, not a deadline on the call.
    async def stop(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        """SIGTERM, then SIGKILL after ``timeout``; remove an owned temp dir. Idempotent."""
        await self._terminate(timeout)
        if self._owns_dir:
            shutil.rmtree(self._data_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the process now (crash tests); the data dir is kept for :meth:`restart`."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    async def restart(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        """Stop (if running) and start again on the same port with the same data dir."""
        await self._terminate(timeout)
        self._fixed_port = True
        await self.start()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # -- internals --------------------------------------------------------------------------
    def _spawn(self) -> None:
        log = (self._data_dir / self.log_name).open("ab")
        with log:
            self._proc = subprocess.Popen(
                [*self.wrapper, *self._argv()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._data_dir,
                env=self._env(),
                start_new_session=True,  # a Ctrl-C in a terminal is for us, not for the child
            )

    async def _wait_ready(self) -> bool:
        """Poll until ready; return True if the process exited instead."""
        assert self._proc is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                return True
            with contextlib.suppress(OSError, asyncio.TimeoutError, ValueError):
                if await self._probe():
                    return False
            await asyncio.sleep(POLL_S)
        self.kill()
        raise ServerError(
            f"{self.name} not ready within {READY_TIMEOUT_S}s:\n{self._log_tail()}",
            server=self.name, port=self._port,
        )

    async def _terminate(self, grace: float) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = (self._data_dir / self.log_name).read_text(errors="replace")
        except OSError:
            return "(no output)"
        return "\n".join(text.splitlines()[-lines:])

    async def _exchange(self, send: bytes, *, bulk: bool = False, skip: int = 0,
                        start_tls: ssl.SSLContext | None = None) -> bytes:
        """Connect, send ``send``, return the first line (or RESP bulk string) answered
        after ``skip`` lines; ``start_tls``: then upgrade to TLS, as a client of a server
        that greets in plain text (NATS) does, so the server sees a whole handshake."""
        async with asyncio.timeout(0.5):
            reader, writer = await asyncio.open_connection(self.host, self._port,
                                                           ssl=self._probe_tls())
        try:
            if send:
                writer.write(send)
                await writer.drain()
            async with asyncio.timeout(0.5):
                for _ in range(skip):
                    await reader.readline()
                line = await reader.readline()
                if bulk and line.startswith(b"$"):
                    return await reader.readexactly(int(line[1:]) + 2)
                if start_tls is not None:
                    await writer.start_tls(start_tls)
                return line
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def find_binary(name: str, explicit: str | None, env: str, dirs: list[str], hint: str) -> str:
    """Explicit path, then ``$env``, then the given dirs, then ``PATH``."""
    chosen = explicit or os.environ.get(env)
    if chosen:
        if os.access(chosen, os.X_OK) and Path(chosen).is_file():
            return chosen
        raise ServerBinaryMissing(f"{name} not found at {chosen}: {hint}", binary=name)
    for folder in dirs:
        candidate = Path(folder) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise ServerBinaryMissing(f"{name} not found: {hint}", binary=name)
    return found
