"""MCP tools announced by Hands, learned by Brains.

A Hands adds ``mcp: {server: [declaration, ...]}`` to its service announcement
(:mod:`baton.store.workers`, every 3.3 s while it runs). A Brain that runs agents naming MCP
servers reads the live announcements at most every :data:`REFRESH_MS` when it builds a model
request, and declares each announced tool in its app (an :class:`MCPTool` that only Hands
can call), with the replay policy, timeout and approval of the Brain's own app: what the
Brain commits with a tool run comes from its code, never from a Hands.
"""

from __future__ import annotations

from typing import Any

from baton.app import App
from baton.mcp.server import MCPServer, MCPTool
from baton.observability.log import get_logger
from baton.store.keys import Keys
from baton.store.workers import all_services

__all__ = ["REFRESH_MS", "announce", "learn"]

REFRESH_MS = 2_000

log = get_logger("baton.mcp")


def announce(tools: list[MCPTool]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for t in tools:
        out.setdefault(t.server.name, []).append(t.declaration())
    return out


async def learn(app: App, redis: Any, keys: Keys, now_ms: int) -> None:
    """Declare in ``app`` the tools live Hands announce for the app's MCP servers (looking
    again at once while a server has none known yet: its Hands may have just started)."""
    if not app.mcp:
        return
    served = {getattr(getattr(t, "server", None), "name", None) for t in app.tools.values()}
    if now_ms - app.mcp_learned_ms < REFRESH_MS and all(s.name in served for s in app.mcp):
        return
    app.mcp_learned_ms = now_ms
    servers: dict[str, MCPServer] = {s.name: s for s in app.mcp}
    for service in await all_services(redis, keys, now_ms):
        if service.get("role") != "hands" or not service.get("alive"):
            continue
        for server_name, declarations in (service.get("mcp") or {}).items():
            server = servers.get(server_name)
            if server is None:
                continue
            for d in declarations:
                known = app.tools.get(str(d["name"]))
                if isinstance(known, MCPTool) and known.declaration() == d:
                    continue
                tool = MCPTool(server, str(d["mcp_name"]), str(d.get("description", "")),
                               dict(d.get("parameters") or {}), callable_here=False)
                if tool.name == d["name"]:
                    app.tools[tool.name] = tool
    if missing := [s.name for s in app.mcp
                   if not any(getattr(t, "server", None) is s for t in app.tools.values())]:
        log.warning("mcp_tools_unknown", servers=missing,
                    reason="no live Hands announces their tools yet: not offered to the model")
