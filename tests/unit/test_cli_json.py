"""``--json`` output meets a reader that goes away: no error to report, no traceback. (That
every command takes ``--json``, and what it means, is tests/unit/test_cli_convention.py.)"""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """``baton ... | head``: output written after the reader closed its end is no error to
    report (it used to surface as "cannot connect: Broken pipe"), and no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "baton", "inspect", "--help"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "BATON_DEBUG": ""})
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1
    assert err == "", err


# A command that printed its first result, then writes its second after the reader closed
# the pipe (as ``baton submit --wait | head -1`` does): it waits on stdin, which the test
# closes only once it has closed the reading end of stdout.
_WRITES_AFTER_THE_READER_LEFT = """
import asyncio, sys
from baton.cli.common import emit, run

async def go():
    emit(False, None, "submitted")
    sys.stdout.flush()
    await asyncio.to_thread(sys.stdin.read)
    async with asyncio.TaskGroup() as tasks:  # inside a task group, as the services' waits are
        tasks.create_task(asyncio.to_thread(lambda: (emit(False, None, "settled"),
                                                     sys.stdout.flush())))

run(go())
"""


def test_a_reader_that_goes_away_during_an_async_command_ends_it_quietly() -> None:
    """The second result of a command run by ``run`` meets a closed pipe: exit 1 and nothing
    on stderr, not "error: cannot connect: [Errno 32] Broken pipe" (exit 3)."""
    proc = subprocess.Popen([sys.executable, "-c", _WRITES_AFTER_THE_READER_LEFT],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "BATON_DEBUG": ""})
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"submitted\n"
    proc.stdout.close()
    proc.stdin.close()  # now the command writes its second line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1, err
    assert err == "", err
