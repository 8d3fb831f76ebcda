"""Serve the tools of Model Context Protocol servers from Hands.

    from baton import Agent, App
    from baton.mcp import MCPServer, MCPToolOptions

    files = MCPServer("files", command=["npx", "-y", "@modelcontextprotocol/server-filesystem",
                                        "/srv/data"],
                      tools={"read_file": MCPToolOptions(replay="safe")},
                      default=MCPToolOptions(approval=True))
    search = MCPServer("search", url="http://search.internal:8000/mcp")
    app = App(agents=[Agent(name="helper", model="openai:gpt-4o-mini",
                            mcp=("files", "search"))], tools=[], mcp=[files, search])

Each Hands connects to the servers through the official ``mcp`` SDK (stdio: it starts the
command as its child; streamable HTTP: it connects to the URL), lists their tools at start,
serves each as a Baton tool under its attempt fence with the replay policy, timeout and
approval set here, and announces them; Brains offer them to the agents that name the
server (``baton.mcp.catalog``). A server that dies is started (or reconnected) again on the
next call; a call it took down with it follows the tool's replay policy
(``baton.mcp.connection``). Needs Baton's ``mcp`` extra
(from a checkout: ``pip install '.[mcp]'``).
"""

from baton.mcp.connection import MCPConnection, MCPConnectionLost, MCPServerUnavailable
from baton.mcp.server import MCPServer, MCPTool, MCPToolOptions

__all__ = ["MCPConnection", "MCPConnectionLost", "MCPServer", "MCPServerUnavailable", "MCPTool",
           "MCPToolOptions"]
