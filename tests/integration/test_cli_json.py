"""``--json`` on the commands that are not request/answer: the services, the mail service and
the benchmarks (``dev`` is covered by tests/integration/test_dev.py)."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from typing import Any

from baton.bench import BENCHES
from baton.settings import Settings


def _popen(*args: str, env: dict[str, str], **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "baton", *args],
                            env={**os.environ, "BATON_DEBUG": "", **env}, **kw)


def test_a_service_logs_json_lines_on_a_terminal_with_json(settings: Settings) -> None:
    """On a terminal a service logs for a person unless --json asks for JSON lines."""
    primary, secondary = pty.openpty()
    proc = _popen("relay", "--json", "--name", "relay-json", env=settings.to_env(),
                  stdin=subprocess.DEVNULL, stdout=secondary, stderr=secondary)
    os.close(secondary)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while b"relay_started" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 1.0)
            if ready:
                try:
                    seen += os.read(primary, 65536)
                except OSError:  # the process ended: its side of the terminal is gone
                    break
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        os.close(primary)
    lines = [line for line in seen.decode().replace("\r", "").splitlines() if line.strip()]
    started = [line for line in lines if "relay_started" in line]
    assert started, seen
    assert json.loads(started[0])["event"] == "relay_started"
    for line in lines:  # every line, stdlib records included, is a JSON object
        assert isinstance(json.loads(line), dict), line


def test_the_mail_service_says_where_it_listens_as_json() -> None:
    proc = _popen("mailbox", "--json", "--port", "0", env={}, stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert first["event"] == "mailbox_listening" and first["url"].startswith("http://127.0.0.1:")


def test_the_benchmark_list_as_json_lines() -> None:
    done = subprocess.run([sys.executable, "-m", "baton", "bench", "--list", "--json"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    listed = [json.loads(line) for line in done.stdout.splitlines()]
    assert [item["name"] for item in listed] == list(BENCHES)
    assert all(item["description"] for item in listed)
