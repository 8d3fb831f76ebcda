"""One Hands process's connection to one MCP server, through the official ``mcp`` SDK.

The SDK's ``Client`` is an async context manager whose background tasks must start and end
in one task, so a keeper task holds it open (:meth:`MCPConnection._keep`) and calls go
through it. A stdio server is a child process of the keeper: when it dies, the keeper ends,
and the next call starts a new one (the restart); a streamable-HTTP server is reconnected the
same way once it answers again.

What a failure proves decides what Hands may do next (baton.hands.retries):

    MCPServerUnavailable  the server could not be reached: the call never left
                          (a ConnectionRefusedError: retried within the run's deadline,
                          whatever the replay policy)
    MCPConnectionLost     the connection closed while a call was in flight: it may have
                          acted (a ConnectionResetError: a ``safe`` tool runs again, a
                          ``confirm`` tool asks first, an ``unsafe`` tool's error is final)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from baton.errors import UnavailableError
from baton.observability.log import error_text, get_logger

__all__ = ["MCPConnection", "MCPConnectionLost", "MCPServerUnavailable"]

log = get_logger("baton.mcp")

CONNECT_TIMEOUT_S = 30.0  # a stdio server starts a Python interpreter: seconds on a busy host


def innermost(exc: BaseException) -> BaseException:
    """The error inside the task groups' wrappers (``ExceptionGroup: unhandled errors in a
    TaskGroup (1 sub-exception)`` says nothing of a server that exited, say)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


class MCPServerUnavailable(ConnectionRefusedError):
    """The MCP server could not be reached; nothing was sent."""


class MCPConnectionLost(ConnectionResetError):
    """The connection to the MCP server closed while a call was in flight."""


class MCPDiscoveryUnavailable(UnavailableError):
    """The MCP server cannot be reached to list its tools (a Hands waits and tries again)."""

    code = "mcp_unavailable"


class MCPConnection:
    """A lazily (re)opened session with one MCP server: a stdio ``command`` or a ``url``."""

    def __init__(self, name: str, *, command: Sequence[str] | None = None,
                 url: str | None = None, env: Mapping[str, str] | None = None,
                 cwd: str | None = None) -> None:
        if (command is None) == (url is None):
            raise ValueError("an MCP server needs exactly one of command and url")
        self.name = name
        self.command = list(command or ())
        self.url = url
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self._client: Any = None
        self._keeper: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[Any] | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()
        self.starts = 0  # how many sessions were opened (1 + restarts)

    @property
    def target(self) -> str:
        return self.url or " ".join(self.command)

    def _server(self) -> Any:
        if self.url is not None:
            return self.url
        from mcp import StdioServerParameters

        # The child gets the given environment (or this process's), never more.
        env = self.env if self.env is not None else dict(os.environ)
        return StdioServerParameters(command=self.command[0], args=self.command[1:], env=env,
                                     cwd=self.cwd)

    async def _keep(self, ready: asyncio.Future[Any]) -> None:
        from mcp import Client

        try:
            async with Client(self._server()) as client:
                if not ready.done():
                    ready.set_result(client)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                cause = innermost(exc)
                ready.set_exception(MCPServerUnavailable(
                    f"MCP server {self.name} ({self.target}) cannot be reached: "
                    f"{type(cause).__name__}: {cause}"))
            elif not self._stop.is_set():
                log.warning("mcp_session_ended", server=self.name, error=error_text(innermost(exc)))
        finally:
            self._client = None

    async def client(self) -> Any:
        """The open session, opening one (starting a stdio server) when there is none."""
        async with self._lock:
            if self._client is not None and self._keeper is not None \
                    and not self._keeper.done():
                return self._client
            self._stop.clear()
            ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._keeper = asyncio.create_task(self._keep(ready), name=f"mcp:{self.name}")
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    self._client = await ready
            except TimeoutError:
                await self._end_keeper()
                raise MCPServerUnavailable(
                    f"MCP server {self.name} ({self.target}) did not answer within "
                    f"{CONNECT_TIMEOUT_S:g}s") from None
            self.starts += 1
            log.info("mcp_session_opened", server=self.name, starts=self.starts)
            return self._client

    async def list_tools(self) -> list[Any]:
        """Every tool the server offers (all pages)."""
        client = await self.client()
        tools: list[Any] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def call(self, tool: str, arguments: dict[str, Any], timeout: float) -> Any:  # noqa: ASYNC109
        """``tools/call``: the ``CallToolResult``; see the module docstring for failures."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        client = await self.client()
        try:  # a server that died while idle is found here, before anything is sent
            # (a listing, not a ping: ping is gone from the 2026-07-28 protocol)
            async with asyncio.timeout(min(timeout, 5.0)):
                await client.list_tools(cache_mode="bypass")
        except (MCPError, TimeoutError) as exc:
            await self._end_keeper()
            log.info("mcp_session_reopened", server=self.name, reason=repr(exc))
            client = await self.client()
        try:
            return await client.call_tool(tool, arguments, read_timeout_seconds=timeout)
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise
            await self._end_keeper()  # the next call opens a new session
            raise MCPConnectionLost(
                f"MCP server {self.name} closed the connection during {tool}: the call's "
                f"outcome is unknown") from exc

    async def _end_keeper(self) -> None:
        keeper = self._keeper
        self._stop.set()
        if keeper is not None and not keeper.done():
            keeper.cancel()
            with contextlib.suppress(BaseException):
                await keeper
        self._client = None

    async def close(self) -> None:
        async with self._lock:
            await self._end_keeper()

