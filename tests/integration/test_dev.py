"""The local stack as separate OS processes: DevStack, ``baton dev`` and ``baton demo``."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from baton.devkit.dev import _pid_alive
from baton.devkit.devstack import DevStack
from baton.settings import Settings
from tests.helpers import five_notices_once_each
from tests.model_server import ModelServer


def _baton(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "baton", *args], capture_output=True, text=True,
        timeout=timeout, env={**os.environ, **(env or {})}, check=False,
    )
    assert done.returncode == 0, f"baton {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


async def test_stack_runs_five_notices_respawns_a_killed_worker_and_stops_clean(
    tmp_path: Path,
) -> None:
    stack = DevStack(tmp_path, brains=1, hands=1, relays=1)
    seen_pids: set[int] = set()
    async with stack:
        seen_pids |= {p["pid"] for p in stack.processes}
        assert {p["name"] for p in stack.processes} >= {"brain-1", "hands-1", "relay-1", "mailbox"}
        await five_notices_once_each(stack.settings(), stack.mail_url, timeout=30)

        old = stack.proc("hands-1").pid
        stack.kill("hands-1")
        await stack.wait_exit("hands-1")
        proc = await stack.wait_ready("hands-1", fail_fast=False)
        assert proc.restarts == 1 and proc.pid != old and proc.alive
        seen_pids |= {p["pid"] for p in stack.processes}
    assert not [pid for pid in seen_pids if _pid_alive(pid)]
    await stack.stop()  # idempotent


async def test_kill_without_respawn_stays_down(tmp_path: Path) -> None:
    async with DevStack(tmp_path, brains=0, hands=2, relays=0) as stack:
        stack.kill("hands-2", respawn=False)
        await stack.wait_exit("hands-2")
        extra = await stack.spawn("hands", env={"BATON_HANDS_CONCURRENCY": "1"})
        assert extra.name == "hands-3"
        assert not stack.proc("hands-2").alive and stack.proc("hands-1").alive
        assert stack.proc("hands-2").restarts == 0
        stack.pause("hands-1")  # stop() must still end a SIGSTOPped process (SIGCONT)
        paused = stack.proc("hands-1")
    assert not paused.alive


def test_baton_dev_detached_serves_submit_and_stops(tmp_path: Path) -> None:
    env = {"BATON_HOME": str(tmp_path / "home")}
    # a URL left exported for an earlier stack: up warns of it, and while it is set the
    # commands fail naming it, with the stack's own URL
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        stale = {"BATON_REDIS_URL": f"redis://127.0.0.1:{s.getsockname()[1]}/0"}
    up = subprocess.run([sys.executable, "-m", "baton", "dev", "up", "--detach", "--hands", "1"],
                        capture_output=True, text=True, timeout=120, check=False,
                        env={**os.environ, **env, **stale})
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        info = json.loads((tmp_path / "home" / "dev.json").read_text())
        pids = [info["supervisor_pid"], *(p["pid"] for p in info["processes"])]
        warnings = [line for line in up.stderr.splitlines() if line.startswith("warning: ")]
        assert warnings == [f"warning: BATON_REDIS_URL ({stale['BATON_REDIS_URL']}) in this "
                            "environment names other servers than this stack's and wins over "
                            "it in commands run from this shell: unset it, or run eval "
                            '"$(baton dev status --env)"'], up.stderr
        failed = subprocess.run([sys.executable, "-m", "baton", "submit", "hi"],
                                capture_output=True, text=True, timeout=60, check=False,
                                env={**os.environ, **env, **stale, "BATON_DEBUG": ""})
        assert failed.returncode == 3 and failed.stderr.startswith(
            f"error: cannot reach Redis at {stale['BATON_REDIS_URL']}"), failed.stderr
        assert failed.stderr.rstrip().endswith(
            f"(BATON_REDIS_URL from the environment; the local stack's is {info['redis_url']} "
            "if a stack runs: see `baton dev status`)"), failed.stderr
        out = _baton("submit", "--wait", "--json", "Send the approved notice to ada@example.com",
                     env=env)
        assert json.loads(out.splitlines()[-1])["status"] == "completed"
    finally:
        _baton("dev", "down", env=env)
    assert not (tmp_path / "home" / "dev.json").exists()
    assert not [pid for pid in pids if _pid_alive(pid)]


def test_demo_kills_a_hands_mid_send_and_every_mail_goes_out_once(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "baton", "demo"], capture_output=True,
                          text=True, timeout=110, check=False,
                          env={**os.environ, "BATON_HOME": str(tmp_path / "home")})
    last = done.stdout.strip().splitlines()[-1]
    summary = json.loads(last)
    assert done.returncode == 0, done.stdout + done.stderr
    assert summary["ok"] is True
    assert summary["delivered"] == 5 and summary["duplicates"] == 0
    assert summary["raw_sends"] == 5 and summary["takeovers"] >= 1
    assert summary["status"] == "completed"
    assert "takeover" in done.stdout and "confirm" in done.stdout


def test_baton_dev_up_status_logs_down(tmp_path: Path) -> None:
    env = {"BATON_HOME": str(tmp_path / "home")}
    started = json.loads(_baton("dev", "up", "--detach", "--hands", "1", "--json", env=env))
    try:
        status = json.loads(_baton("dev", "status", "--json", env=env))
        assert status["running"] is True and status["redis_url"].startswith("redis://")
        assert started["supervisor_pid"] == status["supervisor_pid"]
        assert started["redis_url"] == status["redis_url"] and started["ready"] is True
        names = {p["name"] for p in status["processes"] if p["alive"]}
        assert {"brain-1", "hands-1", "relay-1", "redis", "nats", "api"} <= names
        table = _baton("dev", "status", env=env)
        assert "relay-1" in table and status["nats_url"] in table
        # The HTTP API and console on loopback, with a token of the stack's own: in a 0600
        # file, and in the console address printed for the developer (in the fragment).
        tokens_file = Path(status["api_tokens_file"])
        assert tokens_file.stat().st_mode & 0o777 == 0o600
        token = tokens_file.read_text().split("operate:", 1)[1].strip()
        assert f"{status['api_url']}/console/#token={token}" in table.replace("\n", "")
        refused = httpx.get(f"{status['api_url']}/v1/workers", timeout=10)
        assert refused.status_code == 401, refused.text
        workers = httpx.get(f"{status['api_url']}/v1/workers", timeout=10,
                            headers={"Authorization": f"Bearer {token}"}).json()
        assert {"agent": "notices", "compat": 1, "brains": ["brain-1"]} in workers["levels"]
        assert "relay-1" in _baton("dev", "logs", env=env).split()
        assert "relay_started" in _baton("dev", "logs", "relay-1", env=env)
        listed = json.loads(_baton("dev", "logs", "--json", env=env))
        assert {"relay-1", "redis", "nats"} <= set(listed)
        # every line an object: the services' own JSON lines, the servers' text wrapped
        for name in ("relay-1", "redis"):
            lines = _baton("dev", "logs", name, "--json", "-n", "20", env=env).splitlines()
            assert lines and all(isinstance(json.loads(line), dict) for line in lines), name
        # a Brain serves the notices agent here: --require-brain lets the input in
        out = _baton("submit", "--require-brain", "--json", "hello", env=env)
        assert json.loads(out)["created"] is True
        # what a library user exports for Settings.from_env() (eval "$(baton ... --env)")
        exports = dict(shlex.split(line)[1].split("=", 1)
                       for line in _baton("dev", "status", "--env", env=env).splitlines())
        library = Settings.from_env(exports)
        assert (library.redis_url, library.nats_url) == (status["redis_url"],
                                                          status["nats_url"])
    finally:
        down = json.loads(_baton("dev", "down", "--json", env=env))
    assert down["stopped"] is True and isinstance(down["killed"], list)
    gone = subprocess.run([sys.executable, "-m", "baton", "dev", "status"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **env}, check=False)
    assert gone.returncode == 1 and "no stack running" in gone.stderr
    assert not [pid for pid in (p["pid"] for p in status["processes"]) if _pid_alive(pid)]


@pytest.mark.parametrize(("model", "env"), [
    ("openai-compatible:test-model", {"OPENAI_BASE_URL": "{openai}", "OPENAI_API_KEY": "{key}"}),
    ("anthropic:claude-test", {"ANTHROPIC_BASE_URL": "{anthropic}",
                               "ANTHROPIC_API_KEY": "{key}"}),
])
async def test_baton_dev_model_runs_the_example_on_a_real_model_client(
    tmp_path: Path, model: str, env: dict[str, str]
) -> None:
    """`baton dev up --model PROVIDER:NAME`: the example's tools, the model over HTTP (the local
    protocol server), its address and key from the providers' own variable names."""
    async with ModelServer() as server:
        urls = {"openai": server.openai_url, "anthropic": server.anthropic_url,
                "key": server.key}
        run_env = {**os.environ, "BATON_HOME": str(tmp_path / "home"),
                   "BATON_MODEL_MAX_TOKENS": "512",
                   **{k: v.format(**urls) for k, v in env.items()}}

        async def baton(*args: str) -> str:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "baton", *args, env=run_env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 120)
            assert proc.returncode == 0, f"baton {' '.join(args)}:\n{out.decode()}\n{err.decode()}"
            return out.decode()

        await baton("dev", "up", "--detach", "--hands", "1", "--model", model)
        try:
            status = json.loads(await baton("dev", "status", "--json"))
            assert status["model"] == model
            out = await baton("submit", "--wait", "--json",
                              "Send the approved notice to ada@example.com")
        finally:
            await baton("dev", "down")
    final = json.loads(out.splitlines()[-1])
    assert final["status"] == "completed", final
    assert final["answer"] == "Summary of 1 notices: ada@example.com: sent."
    seen = server.requests
    assert [r.body["model"] for r in seen] == [model.split(":", 1)[1]] * 2
    assert all(r.body["max_tokens"] == 512 for r in seen)


def test_baton_dev_model_without_its_key_fails_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ANTHROPIC_API_KEY", "BATON_ANTHROPIC_API_KEY")}
    done = subprocess.run(
        [sys.executable, "-m", "baton", "dev", "up", "--model", "anthropic:claude-sonnet-4-5"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**env, "BATON_HOME": str(tmp_path / "home")})
    assert done.returncode != 0
    assert "needs ANTHROPIC_API_KEY" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "home" / "dev.json").exists()


def _poll(done: Callable[[], bool], failure: str, timeout: float = 60.0) -> None:
    """Poll ``done`` (another process's doing) until it holds, with a deadline."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, failure
        time.sleep(0.2)


def test_a_durable_stacks_servers_are_started_again_when_they_die(tmp_path: Path) -> None:
    """A SIGKILLed redis-server or nats-server stayed dead (a zombie), with no line in
    dev.log and `dev status` showing it down; a durable stack starts each again on its port
    with its data, says so, and serves on."""
    import signal

    env = {"BATON_HOME": str(tmp_path / "home")}
    _baton("dev", "up", "--detach", "--durable", "--hands", "1", "--no-api", env=env)
    try:
        out = _baton("submit", "--wait", "--json", "Send the approved notice to ada@example.com",
                     env=env)
        assert json.loads(out.splitlines()[-1])["status"] == "completed"
        before = {p["name"]: p["pid"] for p in
                  json.loads(_baton("dev", "status", "--json", env=env))["processes"]}
        for name in ("redis", "nats"):
            os.kill(before[name], signal.SIGKILL)

        def back() -> bool:
            procs = json.loads(_baton("dev", "status", "--json", env=env))["processes"]
            now = {p["name"]: (p["pid"], p["alive"]) for p in procs}
            return all(now[n][1] and now[n][0] != before[n] for n in ("redis", "nats"))

        _poll(back, "redis and nats were not started again")
        log = (tmp_path / "home" / "logs" / "dev.log").read_text()
        assert "redis exited (code -9); starting it again" in log and "redis is back" in log
        assert "nats exited (code -9)" in log and "nats is back" in log
        out = _baton("submit", "--wait", "--json", "--timeout", "90",
                     "Send the approved notice to grace@example.com", env=env, timeout=120)
        assert json.loads(out.splitlines()[-1])["status"] == "completed"
    finally:
        _baton("dev", "down", env=env)


def test_a_non_durable_stack_says_its_redis_is_gone_and_does_not_restart_it(
    tmp_path: Path,
) -> None:
    """An empty Redis in its place would be lost state (the workers stop on the store
    epoch): the stack says what to do instead."""
    import signal

    env = {"BATON_HOME": str(tmp_path / "home")}
    _baton("dev", "up", "--detach", "--hands", "1", "--no-api", env=env)
    try:
        status = json.loads(_baton("dev", "status", "--json", env=env))
        redis = next(p["pid"] for p in status["processes"] if p["name"] == "redis")
        os.kill(redis, signal.SIGKILL)
        log = tmp_path / "home" / "logs" / "dev.log"
        _poll(lambda: "redis exited" in log.read_text(), "no line about redis in dev.log")
        assert "this stack is not durable, so its data is gone" in log.read_text()
        assert "redis is back" not in log.read_text()
    finally:
        _baton("dev", "down", env=env)
