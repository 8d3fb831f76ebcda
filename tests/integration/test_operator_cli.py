"""The read-only commands under the ``operator`` credential: on ``baton dev up --secure`` the
cluster view shows what the client's credential may not read; ``BATON_OPERATOR_*`` and a
secure stack's users pick the credential, the client's when there is no operator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from baton.devkit.dev import _pid_alive
from baton.devkit.secure import CREDENTIALS
from baton.devkit.stack import settings_from_env_or_stack, write_stack


def test_inspect_and_trace_on_a_secure_stack_run_as_the_operator(tmp_path: Path) -> None:
    env = {**os.environ, "BATON_HOME": str(tmp_path / "home")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "baton", *args], capture_output=True,
                              text=True, timeout=90, env=env, check=False)

    def baton(*args: str) -> str:
        done = run(*args)
        assert done.returncode == 0, f"baton {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    baton("dev", "up", "--secure", "--detach", "--hands", "1")
    try:
        info = json.loads((tmp_path / "home" / "dev.json").read_text())
        pids = [info["supervisor_pid"], *(p["pid"] for p in info["processes"])]
        out = baton("submit", "--wait", "--json", "Send the approved notice to ada@example.com")
        done = json.loads(out.splitlines()[-1])
        assert done["status"] == "completed", done
        session = done["session_id"]

        cluster = json.loads(baton("inspect", "--json"))
        # index, outbox backlog, timers and dead letters were read (a client's credential
        # has a "not readable" finding for each), and JetStream's stream and consumer info
        assert not [f for f in cluster["findings"] if "not readable" in f], cluster["findings"]
        assert cluster["sessions_total"] == 1 and cluster["backlog"]
        assert cluster["subjects"]["error"] is None, cluster["subjects"]

        view = json.loads(baton("inspect", session, "--json"))
        assert not [f for f in view["findings"] if "not readable" in f], view["findings"]
        trace = json.loads(baton("trace", session, "--json"))
        assert trace["session_id"] == session and trace["events"], trace
        watched = baton("watch", session, "--json", "--until-settled").splitlines()
        assert watched and all(json.loads(line) for line in watched)
        # A Hands announces itself every 3.3 s and is stale past 10 s: a machine paused for
        # longer (a starved or snapshotted VM) leaves it stale until its next announcement.
        deadline = time.monotonic() + 30
        while True:
            done = run("health", "--role", "hands", "--name", "hands-1", "--json")
            health = json.loads(done.stdout)
            if health["healthy"] or time.monotonic() > deadline:
                break
        assert health["healthy"] and done.returncode == 0, health
    finally:
        baton("dev", "down")
    assert not [pid for pid in pids if _pid_alive(pid)]


@pytest.fixture
def secure_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A secure stack's description (no servers: only which credential is picked)."""
    for name in [k for k in os.environ if k.startswith("BATON_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("BATON_HOME", str(tmp_path))
    write_stack({"redis_url": "rediss://127.0.0.1:1/0", "nats_url": "tls://127.0.0.1:2",
                 "namespace": "baton", "secure": True, "base_dir": str(tmp_path),
                 "tls_ca": str(tmp_path / "ca.pem")})
    (tmp_path / CREDENTIALS).write_text(json.dumps({"client": "cpw", "operator": "opw"}))
    return tmp_path


def test_a_secure_stacks_read_only_commands_use_its_operator(secure_stack: Path) -> None:
    op = settings_from_env_or_stack("operator")
    assert op.redis_url == "rediss://operator:opw@127.0.0.1:1/0"
    assert (op.nats_user, op.nats_password) == ("operator", "opw")
    client = settings_from_env_or_stack()
    assert client.redis_url == "rediss://client:cpw@127.0.0.1:1/0" and not client.nats_user


def test_without_an_operator_the_read_only_commands_use_the_client(secure_stack: Path) -> None:
    (secure_stack / CREDENTIALS).write_text(json.dumps({"client": "cpw"}))
    op = settings_from_env_or_stack("operator")
    assert op.redis_url == "rediss://client:cpw@127.0.0.1:1/0" and not op.nats_user


def test_baton_operator_variables_name_the_operators_credential(
    secure_stack: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BATON_REDIS_URL", "redis://client:c@redis:6379/0")
    monkeypatch.setenv("BATON_OPERATOR_REDIS_URL", "redis://operator:o@redis:6379/0")
    monkeypatch.setenv("BATON_OPERATOR_NATS_USER", "operator")
    monkeypatch.setenv("BATON_OPERATOR_NATS_PASSWORD", "o")
    op = settings_from_env_or_stack("operator")
    assert op.redis_url == "redis://operator:o@redis:6379/0"
    assert (op.nats_user, op.nats_password) == ("operator", "o")
    client = settings_from_env_or_stack()  # the writing commands keep the client's
    assert client.redis_url == "redis://client:c@redis:6379/0" and not client.nats_user
