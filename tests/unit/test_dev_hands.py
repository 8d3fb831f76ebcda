"""`baton dev up` starts no Hands for an app that declares no tools: a Hands with nothing to
serve refuses to start, and the whole stack failed with it."""

from __future__ import annotations

import pytest

from baton.devkit.dev import _hands_for


def test_an_app_of_tasks_alone_starts_no_hands(capsys: pytest.CaptureFixture[str]) -> None:
    assert _hands_for("tests.task_apps:only_tasks", 2) == 0
    assert "declares no tools: no Hands started (--hands 2 ignored)" in capsys.readouterr().err
    assert _hands_for("tests.task_apps:app", 2) == 2  # it has a tool
    assert _hands_for("tests.task_apps:only_tasks", 0) == 0
    assert _hands_for("no_such_module:app", 1) == 1  # its workers say what is wrong
    assert _hands_for("tests.mcp_apps:app", 2) == 2  # MCP tools: Hands serve them
