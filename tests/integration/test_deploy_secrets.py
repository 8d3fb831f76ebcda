"""Where the deployment's secrets may be seen: never on a command line, never in a file
others may read, only in the pod that needs them, never in a log line.

start.sh is run for real with /bin/sh (its external commands wrapped to record their
arguments, redis-server replaced by a recorder); make_env.py is run as a script; the Redis
pod's manifest is read as YAML; a NATS URL with credentials is refused a connection.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from baton.bus.bus import Bus, shown_url
from baton.devkit.servers import free_port
from baton.errors import NatsUnavailable
from baton.settings import Settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ROLES = ("ADMIN", "RELAY", "BRAIN", "HANDS", "CLIENT", "OPERATOR")


def _recorder(bin_dir: Path, name: str, log: Path, real: str | None) -> None:
    """``name`` on PATH: logs its arguments, then runs the real one (if any)."""
    script = bin_dir / name
    run = f'exec {real} "$@"' if real else "exit 0"
    script.write_text(f'#!/bin/sh\nprintf "%s %s\\n" "{name}" "$*" >> "{log}"\n{run}\n')
    script.chmod(0o755)


def test_start_sh_renders_the_users_without_a_password_on_any_command_line(
    tmp_path: Path,
) -> None:
    bin_dir, log, acl = tmp_path / "bin", tmp_path / "argv.log", tmp_path / "out" / "users.acl"
    bin_dir.mkdir()
    acl.parent.mkdir()
    for tool in ("awk", "sed", "mv", "cp", "chmod", "cat"):
        real = shutil.which(tool)
        if real is not None:
            _recorder(bin_dir, tool, log, real)
    _recorder(bin_dir, "redis-server", log, None)
    passwords = {f"{role}_REDIS_PASSWORD": f"secret{role.lower()}0123456789" for role in ROLES}
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **passwords,
           "BATON_ACL_TEMPLATE": str(DEPLOY / "redis" / "users.acl"),
           "BATON_REDIS_CONF": "/etc/baton/redis.conf", "BATON_ACL_FILE": str(acl)}
    done = subprocess.run(["/bin/sh", str(DEPLOY / "redis" / "start.sh")], env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    commands = log.read_text()
    assert "redis-server /etc/baton/redis.conf --aclfile" in commands
    for password in passwords.values():
        assert password not in commands, commands  # what `ps` shows any user
        assert password in acl.read_text()
    assert stat.S_IMODE(acl.stat().st_mode) == 0o600
    rendered = acl.read_text()
    assert "${" not in rendered and not any(line.startswith("#")
                                             for line in rendered.splitlines())
    # A password left unset stops it, naming what is missing.
    del env["HANDS_REDIS_PASSWORD"]
    missing = subprocess.run(["/bin/sh", str(DEPLOY / "redis" / "start.sh")], env=env,
                             capture_output=True, text=True, timeout=30)
    assert missing.returncode != 0 and "HANDS_REDIS_PASSWORD" in missing.stderr


def _make_env(folder: Path) -> subprocess.CompletedProcess[str]:
    for name in ("make_env.py", ".env.example"):
        shutil.copy(DEPLOY / name, folder / name)
    old = os.umask(0)  # the widest: only the script's own mode protects the file
    try:
        return subprocess.run([sys.executable, str(folder / "make_env.py")],
                              capture_output=True, text=True, timeout=30)
    finally:
        os.umask(old)


def test_make_env_creates_the_env_file_private_and_never_through_a_link(
    tmp_path: Path,
) -> None:
    done = _make_env(tmp_path)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE((tmp_path / ".env").stat().st_mode) == 0o600
    # A link planted where .env goes (dangling: "nothing is there") is not followed: the
    # passwords would land wherever it points.
    other = tmp_path / "other"
    other.mkdir()
    (other / ".env").symlink_to(tmp_path / "stolen")
    planted = _make_env(other)
    assert planted.returncode != 0 and "exists" in planted.stderr
    assert not (tmp_path / "stolen").exists()


def test_the_redis_pod_gets_its_own_passwords_only() -> None:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "k8s" / "redis.yaml").read_text()) if d]
    (redis,) = [d for d in docs if d["kind"] == "StatefulSet"]
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    assert not container.get("envFrom"), container.get("envFrom")
    keys = {e["valueFrom"]["secretKeyRef"]["key"] for e in container["env"]
            if "secretKeyRef" in e.get("valueFrom", {})}
    assert keys == {f"{role}_REDIS_PASSWORD" for role in ROLES}


def test_nats_urls_are_shown_without_their_secrets() -> None:
    assert shown_url("nats://relay:pw1@a:4222, tls://b:4222,nats://tok3n@c:4222") == \
        "nats://relay@a:4222,tls://b:4222,nats://c:4222"
    assert shown_url("nats://127.0.0.1:4222") == "nats://127.0.0.1:4222"


async def test_a_failed_nats_connect_names_the_server_not_the_password() -> None:
    url = f"nats://relay:hunter2secret@127.0.0.1:{free_port()}"
    settings = Settings(nats_url=url, connect_timeout_s=0.5)
    with pytest.raises(NatsUnavailable) as failed:
        await Bus.connect(settings, "test")
    assert "hunter2secret" not in str(failed.value)
    assert "hunter2secret" not in str(failed.value.to_dict())
    assert "relay@127.0.0.1" in str(failed.value)
