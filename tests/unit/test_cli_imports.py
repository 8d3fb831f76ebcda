"""The CLI's cheap paths stay cheap: which modules ``baton --help`` and a health probe import.

A structural check, not a timing: the figures are in ``bench/cli_bench.py``.
"""

from __future__ import annotations

import socket
import subprocess
import sys

HEAVY = ("redis", "nats", "rich", "opentelemetry.sdk", "pydantic", "aiohttp", "structlog",
         "baton.models", "baton.store", "baton.client")

_PROBE = """
import sys
from baton.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("\\n".join(sorted(sys.modules)), file=sys.stderr)
"""


def _imported(*args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True,
                          text=True, timeout=60, check=False)
    return set(done.stderr.split())


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_help_imports_no_server_client_ui_or_telemetry_sdk() -> None:
    modules = _imported("--help")
    assert "baton.cli.main" in modules  # the probe did run the command line
    assert _heavy(modules) == []


def test_health_help_and_a_port_probe_import_nothing_heavy() -> None:
    assert _heavy(_imported("health", "--help")) == []
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    modules = _imported("health", "--port", str(port))
    assert "baton.observability.health" in modules
    assert _heavy(modules) == []
