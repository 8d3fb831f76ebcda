"""A process's last telemetry flush is bounded: a collector that accepts connections and
never answers holds no exit past ``BATON_TELEMETRY_FLUSH_TIMEOUT_S`` (the SDK's exporters
would wait out their retries, here set to a minute), and one that answers gets everything.

Each case runs a fresh Python process, as a ``baton`` command does: set up from the
``OTEL_*`` variables, one span, exit.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

SCRIPT = """
import sys
from baton.observability import telemetry
from baton.settings import Settings
assert telemetry.setup("client", Settings(telemetry_flush_timeout_s=float(sys.argv[1])))
with telemetry.tracer().start_as_current_span("exit"):
    pass
print("flushed" if telemetry.shutdown() else "dropped")
"""


@pytest.fixture
def silent_collector() -> Iterator[str]:
    """An endpoint whose connections are accepted by the kernel and never answered."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def _run(endpoint: str, flush_timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_TIMEOUT": "60",
            "OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "none"}
    # Unbounded, this process would wait a minute for the collector at exit: the
    # subprocess timeout below fails the test long before that on any machine.
    return subprocess.run([sys.executable, "-c", SCRIPT, str(flush_timeout_s)], env=env,
                          capture_output=True, text=True, timeout=40, check=True)


def test_a_silent_collector_holds_no_exit_past_the_flush_timeout(silent_collector: str) -> None:
    done = _run(silent_collector, 0.5)
    assert done.stdout.strip() == "dropped"
    assert "not flushed within 0.5 s" in done.stderr, done.stderr


async def test_a_collector_that_answers_gets_the_last_spans() -> None:
    import asyncio

    from baton.bench.obs_bench import otlp_sink

    paths: list[str] = []
    async with otlp_sink(lambda path, _body: paths.append(path)) as (endpoint, received):
        done = await asyncio.to_thread(_run, endpoint, 30.0)
    assert done.stdout.strip() == "flushed", done.stderr
    assert "/v1/traces" in paths and received[0] > 0
