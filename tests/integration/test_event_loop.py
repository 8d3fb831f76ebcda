"""The services' event loop: uvloop by default where installed, asyncio on request."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import uvloop

from baton.cli.common import loop_factory
from baton.errors import ConfigError
from baton.settings import Settings
from tests.helpers import eventually


def test_the_setting_picks_the_loop() -> None:
    assert loop_factory("asyncio") is None
    assert loop_factory("uvloop") is uvloop.new_event_loop
    assert loop_factory("auto") is uvloop.new_event_loop  # installed with the package
    assert Settings().event_loop == "auto"
    with pytest.raises(ConfigError, match="event_loop"):
        Settings(event_loop="trio")


async def _relay_log(settings: Settings, tmp_path: Path, event_loop: str) -> str:
    """Run a relay with ``BATON_EVENT_LOOP=event_loop`` until it says which loop it runs on,
    stop it with SIGTERM; its log."""
    env = {**os.environ, **settings.to_env(), "BATON_EVENT_LOOP": event_loop,
           "BATON_LOG_FORMAT": "json"}
    log_path = tmp_path / f"relay-{event_loop}.log"
    with log_path.open("w") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "baton", "relay", env=env, stdout=out,
            stderr=subprocess.STDOUT)
        try:
            def said_loop() -> bool:
                assert proc.returncode is None, log_path.read_text()
                return '"event_loop"' in log_path.read_text()

            await eventually(said_loop, timeout=60, message="the event_loop line")
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                assert await proc.wait() == 0, log_path.read_text()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    return log_path.read_text()


@pytest.mark.parametrize(("event_loop", "expected"), [
    ("auto", "uvloop.Loop"), ("asyncio", "asyncio.unix_events._UnixSelectorEventLoop")])
async def test_a_service_runs_on_the_loop_its_setting_names(
        settings: Settings, tmp_path: Path, event_loop: str, expected: str) -> None:
    text = await _relay_log(settings, tmp_path, event_loop)
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    said = [line for line in lines if line.get("event") == "event_loop"]
    assert [line["loop"] for line in said] == [expected], text
