"""`baton auth` writes the permission files where it is told, also outside a
checkout (an operator with only the wheel or the image); it crashed without ./deploy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from baton.auth import redis_acl
from baton.cli.auth import auth_command


def test_the_permission_files_are_written_into_a_new_directory(tmp_path: Path) -> None:
    out = tmp_path / "prod-deploy"
    done = CliRunner().invoke(auth_command, ["--namespace", "prod", "--deploy-dir", str(out)])
    assert done.exit_code == 0, done.output
    acl = (out / "redis" / "users.acl").read_text()
    assert "user client " in acl and "~prod:" in acl
    assert "prod.wake" in (out / "nats" / "users.conf").read_text()


def test_an_unwritable_directory_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = CliRunner().invoke(auth_command, ["--deploy-dir", str(blocker / "deploy")])
    assert done.exit_code == 1
    assert done.output.count("\n") == 1 and "cannot write to" in done.output


def test_a_client_appends_wakes_but_cannot_read_them() -> None:
    rules = redis_acl("client", "prod")
    assert "%W~prod:{prod-*}:wakes" in rules
    assert not [r for r in rules if r.endswith(":wakes") and not r.startswith("%W~")]


def test_the_older_module_command_names_the_new_one() -> None:
    # `python -m baton.auth` was how credentials were made; run now, it says where that went
    # rather than doing nothing and exiting 0.
    done = subprocess.run([sys.executable, "-m", "baton.auth", "--help"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "`baton auth`" in done.stderr and not done.stdout
