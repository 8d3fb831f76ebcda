"""``baton dev up`` prints its URLs whole, however narrow the output: a wrapped URL (the
console's carries the API token) is broken when copied."""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.api.auth import dev_token, dev_tokens_file
from baton.devkit.dev import _print_stack


def test_urls_and_paths_are_never_wrapped_at_the_console_width(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    tokens = dev_tokens_file(tmp_path)
    token = dev_token(tmp_path)
    assert token
    api = "http://127.0.0.1:48123"
    _print_stack({"base_dir": str(tmp_path), "processes": [], "api_url": api,
                  "redis_url": "redis://127.0.0.1:48124/0?protocol=3&client_name=baton",
                  "api_tokens_file": str(tokens), "secure": False, "durable": True,
                  "app": "baton.examples.notices:app"})
    lines = capsys.readouterr().out.splitlines()
    console = [line for line in lines if "/console/" in line]
    assert len(console) == 1 and f"{api}/console/#token={token} " in console[0], lines
    assert f"the API token is in {tokens}, mode 0600" in console[0]
    assert any(line.endswith("redis://127.0.0.1:48124/0?protocol=3&client_name=baton")
               for line in lines), lines
    assert any('baton submit --wait "Send the approved notice to ada@example.com"' in line
               for line in lines), lines


def test_the_log_paths_in_the_process_table_are_never_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    base = tmp_path / ("a-long-directory-name-" * 4).rstrip("-")
    _print_stack({"base_dir": str(base), "durable": True, "app": "baton.examples.notices:app",
                  "processes": [
                      {"role": "brain", "name": "brain-1", "pid": 4242, "alive": True},
                      {"role": "redis", "name": "redis", "pid": 4243, "alive": True,
                       "address": "127.0.0.1:48124"}]})
    lines = capsys.readouterr().out.splitlines()
    log = str(base / "logs" / "brain-1.log")
    assert len(log) > 80
    row = [line for line in lines if "brain-1" in line]
    assert len(row) == 1 and log in row[0], lines
    assert any("redis 127.0.0.1:48124" in line for line in lines), lines
