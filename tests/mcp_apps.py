"""Apps whose agent calls MCP tools (tests.mcp_server), for in-process and crash tests.

``app`` (for a crash stack's processes) runs the test server over stdio with its state in
``BATON_TEST_MCP_STATE``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import orjson

from baton.app import Agent, App
from baton.brain.model import ModelRequest, ModelResponse
from baton.mcp import MCPServer, MCPToolOptions
from baton.models import ToolCall

ROOT = Path(__file__).resolve().parents[1]


class CallModel:
    """Calls the tool the user names (``tool {json arguments}``), then answers with its result."""

    def __init__(self) -> None:
        self.offered: list[list[dict[str, Any]]] = []

    async def generate(self, request: ModelRequest) -> ModelResponse:
        self.offered.append(list(request.tools))
        last_user = max(i for i, e in enumerate(request.entries) if e.kind == "user")
        after = request.entries[last_user + 1:]
        results = [e for e in after if e.kind == "tool_result"]
        if results:
            return ModelResponse(text=results[-1].text)
        name, _, args = request.entries[last_user].text.partition(" ")
        return ModelResponse(tool_calls=(ToolCall(id="c1", name=name,
                                                  arguments=orjson.loads(args or "{}")),))


def mcp_app(server: MCPServer, model: CallModel) -> App:
    return App(agents=[Agent(name="calc", model="calls", mcp=(server.name,))], tools=[],
               models={"calls": model}, mcp=[server])


state = Path(os.environ.get("BATON_TEST_MCP_STATE", "."))
app = mcp_app(MCPServer(
    "calc", command=[sys.executable, "-m", "tests.mcp_server", str(state)], cwd=str(ROOT),
    tools={"slow": MCPToolOptions(replay="safe", timeout=60)}), CallModel())
