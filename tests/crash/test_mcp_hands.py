"""A Hands SIGKILLed while an MCP tool runs (its stdio MCP server is its child): a clean
Hands takes the run over, starts its own server and, the tool being ``safe``, runs it again;
the run completes once, with the new server's answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.crash.conftest import Opener
from tests.helpers import eventually

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]


async def test_hands_killed_mid_mcp_call_is_taken_over(crash: Opener, tmp_path: Path) -> None:
    state = tmp_path / "mcp"
    state.mkdir()
    c = await crash(brains=1, hands=1, relays=1, app_spec="tests.mcp_apps:app",
                    env={"BATON_TEST_MCP_STATE": str(state)})
    sub, _ = await c.client.submit('calc_slow {"x": 7}', agent="calc")
    await eventually(lambda: (state / "slow-started").exists(), timeout=60,
                     message="the slow call reached the MCP server")
    c.stack.kill("hands-1", respawn=False)  # mid-call
    await c.stack.wait_exit("hands-1")
    (state / "release").touch()
    clean = await c.stack.spawn("hands", "hands-clean")
    final = await c.settle(sub, timeout=60)
    assert final.status == "completed", final
    (run,) = (await c.store.runs.applied(sub.session_id)).values()
    assert run.result and run.result.ok and run.result.output == {"result": 7}, run.result
    assert run.worker == clean.name and run.result.recovery == "reexecuted", run.result
    assert (state / "calls").read_text().split() == ["slow", "slow"]
