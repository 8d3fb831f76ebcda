"""`python -m baton.auth` writes the permission files where it is told, also outside a
checkout (an operator with only the wheel or the image); it crashed without ./deploy."""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.auth import main, redis_acl


def test_the_permission_files_are_written_into_a_new_directory(tmp_path: Path) -> None:
    out = tmp_path / "prod-deploy"
    main(["--namespace", "prod", "--deploy-dir", str(out)])
    acl = (out / "redis" / "users.acl").read_text()
    assert "user client " in acl and "~prod:" in acl
    assert "prod.wake" in (out / "nats" / "users.conf").read_text()


def test_an_unwritable_directory_is_one_line(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as done:
        main(["--deploy-dir", str(blocker / "deploy")])
    assert done.value.code == 1
    assert "cannot write to" in capsys.readouterr().err


def test_a_client_appends_wakes_but_cannot_read_them() -> None:
    rules = redis_acl("client", "prod")
    assert "%W~prod:{prod-*}:wakes" in rules
    assert not [r for r in rules if r.endswith(":wakes") and not r.startswith("%W~")]
