"""``baton api``: serve the HTTP API and the console with uvicorn until SIGTERM or Ctrl-C.

Bound to loopback by default; bound to every address it needs the host names its clients
use (``BATON_API_HOSTS``, :mod:`baton.api.guard`). Without tokens (``BATON_API_TOKENS`` or
``--tokens-file``) it starts only with ``--dev`` on a loopback address, open to this
machine's processes; ``baton dev`` passes a tokens file of its own instead. On SIGTERM (or
Ctrl-C) uvicorn stops accepting, open event streams end, and the process exits 0 as the other
services do (a second signal stops at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    import uvicorn

__all__ = [
    "DEFAULT_PORT",
    "GC_THRESHOLD",
    "api_command",
    "raise_open_files_limit",
    "serve",
    "tune_gc",
]

DEFAULT_PORT = 8470
_GRACE_S = 5  # open streams get this long to end on shutdown
# Allocations between youngest-generation collections (CPython's default is 700). With a
# thousand open event streams, a full collection walks every stream's objects and stalls
# every stream: measured, the delivery lag p99 at 200 commits/s fell from about 300 ms to
# under 20 ms. A young collection of this many objects costs a few milliseconds.
GC_THRESHOLD = (50_000, 10, 10)


def tune_gc() -> None:
    """Collect cyclic garbage less often, and never walk what was loaded at start again."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def raise_open_files_limit() -> None:
    """Raise the open-files limit to its hard limit: each event stream holds a socket."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


@contextlib.contextmanager
def _stop_on_signals(server: uvicorn.Server) -> Iterator[None]:
    """What :func:`baton.service.run_until_signalled` does for the workers: the first SIGTERM
    or SIGINT stops gracefully (uvicorn stops accepting, streams end within the grace), a
    second stops at once; then :func:`serve` returns and the process exits 0, its telemetry
    flushed. uvicorn's own handlers would raise the signal again once stopped, so the process
    died of it (exit -15 / 143) before the flush."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from baton.observability.log import get_logger

    log = get_logger("baton.api")
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if server.should_exit:
            log.warning("signal_received", signal=sig.name, action="stop")
            server.force_exit = True
        else:
            log.info("signal_received", signal=sig.name, action="drain")
            server.should_exit = True

    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        yield
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def _server(config: uvicorn.Config) -> uvicorn.Server:
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with _stop_on_signals(self):
                yield

    return Server(config)


async def serve(host: str, port: int, dev: bool, tokens_file: Path | None,
                json_logs: bool = False) -> None:
    import uvicorn

    raise_open_files_limit()
    from baton.api.app import create_app
    from baton.api.auth import Tokens
    from baton.cli.common import settings

    config = settings("api", log_format="json" if json_logs else None)
    tokens = Tokens.load(host=host, dev=dev, file=tokens_file)
    # Reach the store before serving: a stack that is down (or a wrong URL) is then one
    # error line, not the traceback uvicorn logs for a startup that failed.
    from baton.client import Client

    await (await Client.connect(config)).close()
    # The views that read across sessions read as the operator, where one is configured
    # (BATON_OPERATOR_REDIS_URL, or a secure stack's): a client's credential reads only its
    # granted sessions.
    from baton.devkit.stack import settings_from_env_or_stack

    reads = settings_from_env_or_stack(user="operator")
    app = create_app(config, tokens,
                     reads if reads.redis_url != config.redis_url else None, host=host)
    tune_gc()
    server = _server(uvicorn.Config(
        app, host=host, port=port, log_config=None, access_log=False, lifespan="on",
        timeout_graceful_shutdown=_GRACE_S, proxy_headers=False, server_header=False))
    await server.serve()
    if not server.started:
        from baton.errors import ServerError

        raise ServerError(f"the API could not start on {host}:{port} (see the log above)",
                          server="api")


@click.command("api")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535),
              help="port to listen on (0: a free one)")
@click.option("--dev", is_flag=True,
              help="allow requests without a token when bound to loopback and no token is set")
@click.option("--tokens-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="role:token lines (roles: read, operate); adds to BATON_API_TOKENS")
@click.option("--json", "as_json", is_flag=True,
              help="JSON Lines: the service's log (stderr), also on a terminal")
def api_command(host: str, port: int, dev: bool, tokens_file: Path | None,
                as_json: bool) -> None:
    """Serve the HTTP API (OpenAPI at /docs) and the web console (at /console/; / leads there)."""
    from baton.cli.common import run

    run(serve(host, port, dev, tokens_file, as_json))
