"""A non-durable stack says so, and a Redis restart under it is reported as lost state.

``baton dev`` without ``--durable`` keeps Redis in memory: a restart loses every session.
Here a running :class:`DevStack` loses its Redis (SIGKILL, restarted empty) while a
``baton submit --wait`` and a ``baton watch`` are waiting on a session: each ends with one
``error:`` line naming the lost store epoch (never a traceback, never "no submission"), and
the workers stop with the same line in their logs.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from baton.devkit.dev import NOT_DURABLE, _print_stack
from baton.devkit.devstack import DevStack
from baton.devkit.servers import EmbeddedStack
from baton.store.keys import Keys
from baton.store.redis_client import connect_redis
from tests.helpers import eventually

EPOCH_LINE = "lost its state: its epoch"


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error: ")]


async def _spawn(env: dict[str, str], *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "baton", *args, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)


async def test_a_redis_restart_under_a_running_stack_is_one_clear_line_everywhere(
    tmp_path: Path,
) -> None:
    stack = DevStack(tmp_path, brains=1, hands=0, relays=1)
    async with stack:
        settings = stack.settings()
        env = {**os.environ, "BATON_DEBUG": "", **settings.to_env(),
               "BATON_HOME": str(tmp_path / "home")}
        # No Brain serves "ghost": the submission stays accepted and --wait keeps waiting.
        submit = await _spawn(env, "submit", "--agent", "ghost", "--session", "s-lost",
                              "--wait", "--timeout", "120", "hello")
        redis = connect_redis(settings)
        inbox = Keys(settings.namespace, settings.shards).session("s-lost").inbox
        try:
            async def submitted() -> bool:  # the request waits for a Brain of "ghost"
                return bool(await redis.exists(inbox))

            await eventually(submitted, timeout=30, message="the submission is recorded")
        finally:
            await redis.aclose()
        watch = await _spawn(env, "watch", "s-lost")
        assert watch.stdout is not None
        first = await asyncio.wait_for(watch.stdout.readline(), 30)
        assert first.startswith(b"== snapshot of s-lost"), first

        servers = stack.servers
        assert isinstance(servers, EmbeddedStack)
        servers.redis.kill()
        await servers.redis.restart()

        out, err = await asyncio.wait_for(submit.communicate(), 90)
        w_out, w_err = await asyncio.wait_for(watch.communicate(), 90)
        for name, code, stdout, stderr in (("submit", submit.returncode, out, err),
                                           ("watch", watch.returncode, w_out, w_err)):
            text = stderr.decode()
            assert code not in (0, None), (name, code, text)
            assert "Traceback" not in text and "no submission" not in text, (name, text)
            errors = _error_lines(text)
            assert len(errors) == 1 and EPOCH_LINE in errors[0], (name, text, stdout)

        for worker in ("brain-1", "relay-1"):
            log = stack.proc(worker).log_path

            def stopped(log: Path = log) -> bool:
                return any(EPOCH_LINE in line for line in _error_lines(log.read_text()))

            await eventually(stopped, timeout=30, message=f"{worker} stops with the error")
            assert "Traceback" not in log.read_text()


def test_baton_dev_without_durable_says_a_restart_loses_sessions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    info = {"base_dir": "/x", "processes": [], "redis_url": "r", "nats_url": "n",
            "mail_url": "m", "namespace": "baton", "app": "baton.examples.notices:app"}
    _print_stack({**info, "durable": False})
    _print_stack({**info, "durable": True})
    out = capsys.readouterr().out
    assert out.count("a Redis restart") == 1 and "loses every session" in out
    assert "--durable" in NOT_DURABLE
