"""A service that fails with a bug (not a BatonError) leaves its traceback in its log, and
the command's one line names the error itself, not "unhandled errors in a TaskGroup"."""

from __future__ import annotations

import json
import subprocess
import sys

from baton.cli.failures import failure

_SERVICE = """
import asyncio
from baton.observability.log import configure
from baton.service import run_until_signalled
from baton.settings import Settings

class Failing:
    role = "relay"
    settings = Settings()
    ready = asyncio.Event()

    def shutdown(self): pass

    async def serve(self):
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.loop())

    async def loop(self):
        raise KeyError("shard-7")

configure(fmt="json")
asyncio.run(run_until_signalled(Failing()))
"""


def test_a_crashed_service_logs_its_traceback() -> None:
    done = subprocess.run([sys.executable, "-c", _SERVICE], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode != 0
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    crashed = [e for e in lines if e.get("event") == "service_crashed"]
    assert crashed, done.stderr
    assert crashed[0]["role"] == "relay" and crashed[0]["level"] == "error"
    assert "KeyError" in crashed[0]["error"]
    assert "in loop" in crashed[0]["exception"]  # the traceback, down to the failing loop


def test_a_task_group_with_one_failure_reads_as_that_failure() -> None:
    group = ExceptionGroup("unhandled errors in a TaskGroup", [ConnectionError("reset")])
    assert failure(group).format_message().startswith("cannot connect: reset")
    message = failure(ExceptionGroup("x", [KeyError("k")])).format_message()
    assert message.startswith("unexpected KeyError: 'k'"), message
    two = failure(ExceptionGroup("x", [KeyError("a"), KeyError("b")])).format_message()
    assert two.startswith("unexpected ExceptionGroup"), two
