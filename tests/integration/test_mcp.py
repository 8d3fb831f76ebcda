"""MCP servers as Hands (baton.mcp), against real Redis/NATS and an MCP server started here.

A Hands lists the server's tools at start and announces them; the Brain offers them to the
model with the server's own schemas and commits each call with the replay policy and
approval the app set. The server dies during a call: a ``safe`` tool is run again on a
restarted server, an ``unsafe`` one ends with the error (the model decides) and the next
call starts the server again. Over streamable HTTP the server is SIGKILLed mid-call and
restarted on its port; the call completes once it is back.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from baton.app import App
from baton.brain.worker import BrainWorker
from baton.client import Client
from baton.devkit.servers import free_port
from baton.hands.worker import HandsWorker
from baton.mcp import MCPServer, MCPToolOptions
from baton.relay.worker import Relay
from baton.settings import Settings
from tests.helpers import eventually, running
from tests.mcp_apps import ROOT, CallModel, mcp_app

pytestmark = pytest.mark.timeout(120)


def calc_server(state: Path, **kwargs: Any) -> MCPServer:
    return MCPServer(
        "calc", tools={"add": MCPToolOptions(replay="safe", timeout=20),
                       "flaky": MCPToolOptions(replay="safe", timeout=60),
                       "slow": MCPToolOptions(replay="safe", timeout=60),
                       "wipe": MCPToolOptions(approval=True),
                       "flaky_confirm": MCPToolOptions(replay="confirm",
                                                       confirm=_effect_of(state))},
        default=MCPToolOptions(timeout=30), **kwargs)


def _effect_of(state: Path) -> Any:
    async def confirm(operation_id: str, arguments: dict[str, Any], ctx: Any) -> Any:
        """What the outside world recorded for this call (here: the server's effect file)."""
        effect = state / f"effect-{arguments['x']}"
        return {"result": int(effect.read_text())} if effect.exists() else None

    return confirm


def stdio_server(state: Path) -> MCPServer:
    return calc_server(state, command=[sys.executable, "-m", "tests.mcp_server", str(state)],
                       cwd=str(ROOT))


def calls(state: Path) -> list[str]:
    path = state / "calls"
    return path.read_text().split() if path.exists() else []


async def ask(client: Client, text: str) -> Any:
    sub, _ = await client.submit(text, agent="calc")
    return await client.wait(sub, timeout=60)


def services(settings: Settings, app: App) -> tuple[Any, ...]:
    return (Relay(settings.model_copy(update={"worker_name": "relay-1"})),
            HandsWorker(settings.model_copy(update={"worker_name": "hands-1"}), app),
            BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app))


async def test_discovered_tools_are_announced_offered_and_called(
    settings: Settings, tmp_path: Path
) -> None:
    server, model = stdio_server(tmp_path), CallModel()
    hands_app, brain_app = mcp_app(server, CallModel()), mcp_app(stdio_server(tmp_path), model)
    relay, hands, _ = services(settings, hands_app)
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), brain_app)
    async with running(relay, hands, brain), await Client.connect(settings) as client:
        final = await ask(client, 'calc_add {"a": 2, "b": 40}')
        assert final.status == "completed", final
        result = orjson.loads(final.answer or "")
        assert result["outcome"] == "ok" and result["output"] == {"result": 42}
        (run,) = (await client.store.runs.applied(final.session_id)).values()
        assert run.intent.tool == "calc_add" and run.intent.replay == "safe"

        # Not named in the app's options: the default, unsafe.
        final = await ask(client, 'calc_note {"text": "hi"}')
        (run,) = (await client.store.runs.applied(final.session_id)).values()
        assert run.intent.replay == "unsafe" and run.result and run.result.ok

        # Approval per tool: the run waits, unsent, for baton approve.
        sub, _ = await client.submit('calc_wipe {"disk": "d1"}', agent="calc")

        async def awaiting() -> list[Any]:
            runs = (await client.store.load(sub.session_id)).runs.values()
            return [r for r in runs if r.status == "awaiting_approval"]

        (run,) = await eventually(awaiting, timeout=20, message="wipe awaiting approval")
        assert "wipe" not in calls(tmp_path)
        await client.approve(sub.session_id, run.run_id, run.intent.approval_digest or "")
        assert (await client.wait(sub, timeout=60)).status == "completed"
    # The Brain's app never connected to the server: it learned the tools from the Hands.
    assert brain_app.mcp[0]._connection is None
    offered = {t["name"]: t for t in model.offered[0]}
    assert set(offered) == {"calc_add", "calc_note", "calc_wipe", "calc_flaky",
                            "calc_flaky_unsafe", "calc_flaky_confirm", "calc_slow"}
    assert offered["calc_add"]["parameters"]["required"] == ["a", "b"]
    assert offered["calc_add"]["description"] == "Add two integers."
    assert calls(tmp_path) == ["add", "note", "wipe"]


async def test_server_dying_mid_call_is_restarted_and_replay_decides(
    settings: Settings, tmp_path: Path
) -> None:
    server = stdio_server(tmp_path)
    app = mcp_app(server, CallModel())
    async with running(*services(settings, app)), await Client.connect(settings) as client:
        # safe: the call that took the server down runs again on a new server process.
        final = await ask(client, 'calc_flaky {"x": 21}')
        assert final.status == "completed", final
        (run,) = (await client.store.runs.applied(final.session_id)).values()
        assert run.result and run.result.ok and run.result.output == {"result": 42}, run.result
        assert server.connection.starts == 2

        # unsafe: the cut-off call is not repeated; the model sees why.
        final = await ask(client, 'calc_flaky_unsafe {"x": 1}')
        (run,) = (await client.store.runs.applied(final.session_id)).values()
        assert run.result and not run.result.ok, run.result
        assert "MCPConnectionLost" in (run.result.error or ""), run.result

        # confirm: the cut-off call acted; confirm finds its effect and adopts it.
        final = await ask(client, 'calc_flaky_confirm {"x": 5}')
        (run,) = (await client.store.runs.applied(final.session_id)).values()
        assert run.result and run.result.ok and run.result.output == {"result": 25}
        assert run.result.recovery == "confirmed", run.result

        # The next call starts the server again.
        final = await ask(client, 'calc_add {"a": 1, "b": 1}')
        (run,) = (await client.store.runs.applied(final.session_id)).values()
        assert run.result and run.result.output == {"result": 2}
        assert server.connection.starts == 4
    assert calls(tmp_path) == ["flaky", "flaky", "flaky_unsafe", "flaky_confirm", "add"]


class HttpServer:
    """The test MCP server over streamable HTTP, as a child process on a fixed port."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.mcp_server", str(self.state), str(self.port),
            cwd=str(ROOT), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()


@pytest.fixture
async def http_server(tmp_path: Path) -> AsyncIterator[HttpServer]:
    server = HttpServer(tmp_path)
    await server.start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.returncode is None:
            await server.kill()


async def test_http_server_killed_mid_call_and_restarted(
    settings: Settings, http_server: HttpServer, tmp_path: Path
) -> None:
    server = calc_server(tmp_path, url=http_server.url)
    app = mcp_app(server, CallModel())
    async with running(*services(settings, app)), await Client.connect(settings) as client:
        sub, _ = await client.submit('calc_slow {"x": 7}', agent="calc")
        await eventually(lambda: (tmp_path / "slow-started").exists(), timeout=30,
                         message="the slow call reached the server")
        await http_server.kill()  # mid-call
        (tmp_path / "slow-started").unlink()
        (tmp_path / "release").touch()
        await http_server.start()  # same port: the Hands reconnects once it answers
        final = await client.wait(sub, timeout=60)
    assert final.status == "completed", final
    (run,) = (await client.store.runs.applied(sub.session_id)).values()
    assert run.result and run.result.ok and run.result.output == {"result": 7}, run.result
    assert calls(tmp_path) == ["slow", "slow"]  # safe: run again on the restarted server
