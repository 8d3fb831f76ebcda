"""``MCPServer``: the tools of a Model Context Protocol server, served by Hands.

Declared in the app that Brains and Hands both load::

    calc = MCPServer("calc", command=["python", "-m", "calc_server"],
                     tools={"add": MCPToolOptions(replay="safe"),
                            "wipe": MCPToolOptions(approval=True)})
    app = App(agents=[Agent(name="calc", mcp=("calc",))], tools=[], mcp=[calc])

A Hands lists the server's tools when it starts (``tools/list``), serves each as a Baton
tool named ``<prefix><tool>`` (default prefix ``<server>_``) with the replay policy, timeout
and approval set here (``default`` for the rest; ``unsafe`` unless said otherwise: a call
cut off by a crash is never repeated on its own), and announces their declarations with its
service announcement. A Brain learns them from those announcements
(:mod:`baton.mcp.catalog`) and offers them to the agents that name the server, so the model
sees the server's own names, descriptions and input schemas.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict

from baton.app import NAME, Tool, ToolContext
from baton.errors import ConfigError, ToolError
from baton.mcp.connection import MCPConnection
from baton.models import ReplayPolicy

__all__ = ["MCPServer", "MCPTool", "MCPToolOptions"]

#: ``confirm(operation_id, arguments, ctx)``: what the outside system recorded, or None.
ConfirmArgs = Callable[[str, dict[str, Any], ToolContext], Awaitable[Any | None]]


@dataclass(frozen=True)
class MCPToolOptions:
    """How Baton runs one MCP tool."""

    replay: ReplayPolicy = "unsafe"
    timeout: float = 30.0
    approval: bool = False
    confirm: ConfirmArgs | None = None
    version: int = 1


class _Arguments(BaseModel):
    """The arguments as the model sent them; the MCP server validates them."""

    model_config = ConfigDict(extra="allow")


@dataclass
class MCPServer:
    """One MCP server: a stdio ``command`` (started by each Hands) or a streamable-HTTP ``url``."""

    name: str
    command: Sequence[str] | None = None
    url: str | None = None
    tools: Mapping[str, MCPToolOptions] = field(default_factory=dict)
    default: MCPToolOptions = MCPToolOptions()
    prefix: str | None = None
    env: Mapping[str, str] | None = None
    cwd: str | None = None

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise ConfigError(f"invalid MCP server name {self.name!r}")
        if importlib.util.find_spec("mcp") is None:  # the SDK is imported when connecting
            raise ConfigError(f"MCP server {self.name}: the MCP SDK is not installed: install "
                              f"Baton's mcp extra (from a checkout: pip install '.[mcp]')")
        if (self.command is None) == (self.url is None):
            raise ConfigError(f"MCP server {self.name}: give exactly one of command and url")
        if self.command is not None and not list(self.command):
            raise ConfigError(f"MCP server {self.name}: empty command")
        for tool, options in {**self.tools, "(default)": self.default}.items():
            if options.replay == "confirm" and options.confirm is None:
                raise ConfigError(f"MCP server {self.name}: tool {tool} has replay='confirm' "
                                  "but no confirm function")
        self._connection: MCPConnection | None = None

    @property
    def connection(self) -> MCPConnection:
        """This process's connection (opened on first use: only Hands use it)."""
        if self._connection is None:
            self._connection = MCPConnection(self.name, command=self.command, url=self.url,
                                             env=self.env, cwd=self.cwd)
        return self._connection

    def tool_name(self, mcp_name: str) -> str:
        """The Baton tool name of the server's tool ``mcp_name``."""
        prefix = f"{self.name.replace('-', '_')}_" if self.prefix is None else self.prefix
        name = re.sub(r"[^a-z0-9_-]", "_", f"{prefix}{mcp_name}".lower())
        if not NAME.match(name):
            raise ConfigError(f"MCP server {self.name}: cannot name tool {mcp_name!r} "
                              f"(gives {name!r})")
        return name

    def options(self, mcp_name: str) -> MCPToolOptions:
        return self.tools.get(mcp_name, self.default)

    async def discover(self) -> list[MCPTool]:
        """List the server's tools now and declare each as a Baton tool."""
        listed = await self.connection.list_tools()
        unknown = set(self.tools) - {t.name for t in listed}
        if unknown:
            raise ConfigError(f"MCP server {self.name} offers no tools named "
                              f"{', '.join(sorted(unknown))}")
        return [MCPTool(self, t.name, t.description or "", dict(t.input_schema)) for t in listed]

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()


class MCPTool(Tool):
    """One tool of an MCP server as a Baton tool; ``tools/call`` runs it."""

    def __init__(self, server: MCPServer, mcp_name: str, description: str,
                 input_schema: dict[str, Any], *, callable_here: bool = True) -> None:
        self.server = server
        self.mcp_name = mcp_name
        options = server.options(mcp_name)

        async def call(args: BaseModel, ctx: ToolContext) -> Any:
            if not callable_here:
                raise ToolError(f"{self.name} runs in Hands only", code="not_here")
            return await self._call(dict(args.model_extra or {}), ctx)

        super().__init__(call, name=server.tool_name(mcp_name), description=description,
                         replay=options.replay, timeout=options.timeout,
                         version=options.version, args_model=_Arguments,
                         approval=options.approval)
        if options.confirm is not None:
            user_confirm = options.confirm

            async def confirm(operation_id: str, args: BaseModel, ctx: ToolContext) -> Any:
                return await user_confirm(operation_id, dict(args.model_extra or {}), ctx)

            self.confirm(confirm)
        self._schema = orjson.dumps(input_schema or {"type": "object"})

    def schema(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "parameters": orjson.loads(self._schema)}

    def declaration(self) -> dict[str, Any]:
        """What a Hands announces of this tool (see baton.mcp.catalog)."""
        return {"name": self.name, "mcp_name": self.mcp_name, "description": self.description,
                "parameters": orjson.loads(self._schema)}

    async def _call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        result = await self.server.connection.call(self.mcp_name, arguments, self.timeout)
        if result.is_error:
            raise ToolError(_text(result) or f"{self.mcp_name} failed", code="mcp_tool_error")
        if result.structured_content is not None:
            return result.structured_content
        return {"content": [c.model_dump(mode="json", exclude_none=True)
                            for c in result.content]}


def _text(result: Any) -> str:
    return "\n".join(str(getattr(c, "text", "")) for c in result.content)[:2000]
