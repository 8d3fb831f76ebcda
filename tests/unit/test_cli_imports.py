"""The CLI's cheap paths stay cheap: which modules ``baton --help`` and a health probe import.

A structural check, not a timing: the figures are in ``baton.bench.cli_bench``.
"""

from __future__ import annotations

import os
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


def _imported(*args: str, env: dict[str, str] | None = None) -> set[str]:
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True,
                          text=True, timeout=60, check=False,
                          env={**os.environ, **env} if env else None)
    return set(done.stderr.split())


def _run(probe: str) -> subprocess.CompletedProcess[str]:
    """``probe`` run by a fresh interpreter (its output captured as text)."""
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)


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


def test_an_announcement_check_needs_redis_but_no_logging_console_or_telemetry() -> None:
    """``health --role`` imports redis-py and the settings; not structlog, rich or Baton's
    telemetry (its CPU, in baton.bench.cli_bench, is mostly redis-py's own import)."""
    with socket.socket() as s:  # a Redis that does not answer: the check fails fast
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    modules = _imported("health", "--role", "brain", "--name", "b-1", env={
        "BATON_REDIS_URL": f"redis://127.0.0.1:{port}/0", "BATON_HOME": "/nonexistent"})
    assert "baton.store.redis_client" in modules  # the probe did reach the check
    assert not [m for m in modules if m.split(".")[0] in ("structlog", "rich")]
    assert "baton.observability.telemetry" not in modules


def test_a_brain_or_relay_loads_without_aiohttp() -> None:
    """nats-py would import aiohttp (for ws:// servers) in every service; only the Hands'
    HTTP pool needs it (baton.hands.http)."""
    probe = ("import sys\n"
             "from baton.bus.lean import import_nats_without_websockets\n"
             "import_nats_without_websockets()\n"
             "import baton.brain.worker, baton.relay.worker\n"
             "print('aiohttp' in sys.modules)\n"
             "import aiohttp  # still importable when a tool needs it\n")
    done = _run(probe)
    assert done.stdout.strip() == "False", done.stdout + done.stderr


def test_a_service_loads_its_libraries_without_their_unused_parts() -> None:
    """The entry points load redis-py without the OpenTelemetry SDK, structlog without rich
    and httpx without its command line (click, pygments, rich); all stay importable."""
    probe = ("import sys\n"
             "import click  # the CLI has it loaded before the entry point runs\n"
             "from baton.bus.lean import import_service_libraries\n"
             "import_service_libraries()\n"
             "import baton.hands.worker, baton.brain.worker, baton.relay.worker\n"
             "print(sorted(m for m in ('opentelemetry.sdk', 'rich', 'pygments', 'aiohttp')\n"
             "             if m in sys.modules))\n"
             "import rich.console, opentelemetry.sdk.trace, httpx, structlog  # noqa\n"
             "assert sys.modules['click'] is click\n")
    done = _run(probe)
    assert done.stdout.strip() == "['aiohttp']", done.stdout + done.stderr
