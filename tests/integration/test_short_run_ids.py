"""``--run`` takes the short run ids trace prints (real servers, the CLI as a process).

Two tasks of one session each have two approval-gated runs (the first task's rejected, the
second's waiting), so ``1-0`` names two runs (ambiguous) while ``<end of task id>/1-0`` and
the full id name one; an id no run has keeps the command's own "no run" / "no receipts" error.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from baton.brain.worker import BrainWorker
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.hands.worker import HandsWorker
from baton.relay.worker import Relay
from baton.settings import Settings
from tests.control_apps import approval_app
from tests.helpers import eventually, running

TEXT = "Send the approved notice to ada@example.com and grace@example.com, then summarise."


async def _cli(env: dict[str, str], *args: str, answer: str = "") -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "baton", *args, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "BATON_DEBUG": "", **env})
    out, err = await asyncio.wait_for(proc.communicate(answer.encode()), 60)
    return proc.returncode or 0, out.decode(), err.decode()


def _error(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    return errors[0]


async def test_run_options_take_the_short_ids_trace_prints(
    settings: Settings, mailbox: MailboxServer, tmp_path: Path,
) -> None:
    settings = settings.model_copy(update={"mail_url": mailbox.url})
    env = {**settings.to_env(), "BATON_HOME": str(tmp_path / "home")}
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), approval_app)
    hands = HandsWorker(settings.model_copy(update={"worker_name": "hands-1"}), approval_app)
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    async with running(relay, hands, brain), Client.connect(settings) as client:
        first, _ = await client.submit(TEXT, agent="notices")
        sid = first.session_id

        async def awaiting(n: int) -> list[str]:
            listed = await client.awaiting_approval(sid)
            return [a.run_id for a in listed] if len(listed) == n else []
        # the first task's two runs, rejected: it ends, and the second task starts
        for rid in await eventually(lambda: awaiting(2), timeout=30):
            await client.reject(sid, rid, "not now")
        await client.wait(first, timeout=30)
        await client.submit(TEXT, agent="notices", session_id=sid)
        second = await eventually(lambda: awaiting(2), timeout=30)
        done = sorted(await client.store.runs.applied(sid))
        old, new = done[0].rsplit("-", 2)[0], second[0].rsplit("-", 2)[0]
        assert old != new and sorted([*done, *second]) == sorted(
            f"{task}-1-{n}" for task in (old, new) for n in (0, 1)), (done, second)
        one, other = sorted([f"{old}-1-0", f"{new}-1-0"])

        # ambiguous: one error line naming both full ids, nothing decided
        for args in (("approve", sid, "--run", "1-0", "--yes"),
                     ("reject", sid, "--run", "1-0"), ("trace", sid, "--run", "1-0")):
            code, out, err = await _cli(env, *args)
            assert code == 1 and out == "", (args, err)
            assert _error(err) == (f"error: run 1-0 is ambiguous: it could be {one}, {other}; "
                                   "give one of these full ids"), args

        # unknown: the commands' own errors, as before
        code, _, err = await _cli(env, "reject", sid, "--run", "9-9")
        assert code == 1 and _error(err).startswith(f"error: no run 9-9 in session {sid}"), err
        code, _, err = await _cli(env, "approve", sid, "--run", "x/1-0", "--yes")
        assert code == 1 and _error(err).startswith(f"error: no run x/1-0 in session {sid}")
        code, _, err = await _cli(env, "trace", sid, "--run", "9-9")
        assert code == 1 and _error(err).startswith(
            f"error: no receipts about run 9-9 in session {sid}"), err

        # short with the task's end, and full: the one run
        code, out, err = await _cli(env, "trace", sid, "--json", "--run", f"{old[-6:]}/1-0")
        assert code == 0 and f"{old}-1-0" in out and f"{new}-1-0" not in out, err
        code, full_out, err = await _cli(env, "trace", sid, "--json", "--run", f"{old}-1-0")
        assert code == 0 and full_out == out, err
        # --task leaves one run whose id ends in 1-0
        code, task_out, err = await _cli(env, "trace", sid, "--json", "--task", old,
                                         "--run", "1-0")
        assert code == 0 and task_out == out, err
        code, out, err = await _cli(env, "reject", sid, "--run", f"{new[-6:]}/1-0")
        assert code == 0 and out.startswith(f"rejected {new}-1-0 (commit "), err
        # asked without --yes: the run is shown on stderr; a no (or no answer) is one error
        # line, and the run still waits
        for answer in ("n\n", ""):
            code, out, err = await _cli(env, "approve", sid, "--run", f"{new[-6:]}/1-1",
                                        answer=answer)
            assert code == 1 and out == "", err
            assert err.startswith(f"run {new}-1-1 (") and "calls " in err, err
            assert _error(err) == "error: not approved; nothing was dispatched", err
            assert err.splitlines()[-1] == _error(err)
        assert f"{new}-1-1" in [a.run_id for a in await client.awaiting_approval(sid)]
        # a yes with --json: stdout is the one JSON object, the question went to stderr
        code, out, err = await _cli(env, "approve", sid, "--run", f"{new}-1-1", "--json",
                                    answer="y\n")
        assert code == 0 and json.loads(out)["run_id"] == f"{new}-1-1", err
        assert len(out.splitlines()) == 1 and "approve these arguments?" in err
