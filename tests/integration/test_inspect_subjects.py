"""``baton inspect`` reports messages that no worker will take, from JetStream itself."""

from __future__ import annotations

from rich.console import Console

from baton.bus.bus import Bus
from baton.cli.inspect import cluster_view, render_cluster
from baton.models import ToolDispatch, Wake
from baton.settings import Settings
from baton.store.store import Store
from tests.integration.hands_app import running


async def test_messages_on_subjects_nobody_consumes_are_reported(settings: Settings) -> None:
    hs = settings.model_copy(update={"worker_name": "hands-i"})
    store = await Store.connect(hs)
    bus = await Bus.connect(hs, "inspect-test")
    try:
        await bus.ensure_streams()
        ghost = ToolDispatch(session_id="s-1", run_id="r-1", tool="ghost")
        wake = Wake(session_id="s-1", reason="commit")
        async with running(hs, tools=["echo"]):
            # A tool no Hands serves, and an agent/compat level no Brain serves.
            await bus.publish(bus.tool_subject("ghost"), ghost.to_json().encode(), msg_id="g")
            await bus.publish(bus.wake_subject("nobody", 7), wake.to_json().encode(),
                              msg_id="w")
            live = await cluster_view(store, bus)
        # The echo consumer stays, but no live Hands serves it any more.
        echo = ToolDispatch(session_id="s-1", run_id="r-2", tool="echo")
        await bus.publish(bus.tool_subject("echo"), echo.to_json().encode(), msg_id="e")
        after = await cluster_view(store, bus)
    finally:
        await bus.close()
        await store.close()

    unconsumed = {r["subject"]: r for r in live["subjects"]["unconsumed"]}
    assert set(unconsumed) == {bus.tool_subject("ghost"), bus.wake_subject("nobody", 7)}
    for row in unconsumed.values():
        assert row["messages"] == 1 and row["consumer"] is None
        assert row["oldest_age_ms"] is not None and row["oldest_age_ms"] >= 0
    stale = {r["subject"]: r for r in after["subjects"]["unconsumed"]}
    assert stale[bus.tool_subject("echo")]["consumer"] == bus.names.tool_durable("echo")
    assert stale[bus.tool_subject("echo")]["served"] is False
    console = Console(record=True, width=200)
    render_cluster(after, console)
    shown = console.export_text()
    assert "Messages waiting in JetStream" in shown
    assert f"UNCONSUMED 1 message(s) on {bus.tool_subject('ghost')}" in shown
    assert f"on {bus.tool_subject('echo')}" in shown and "no live Hands serves it" in shown
