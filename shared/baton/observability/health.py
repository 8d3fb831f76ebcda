"""Health checks of a service: an HTTP endpoint (aiohttp.web) and the ``baton health`` command.

With ``BATON_HEALTH_PORT`` set, every service answers on that port (all interfaces, for
orchestrator probes, unless ``BATON_HEALTH_HOST`` names one address):

* ``GET /healthz``: liveness. Answered by the service's own event loop, so a wedged loop
  fails the probe by timing out; 200 while the process serves or drains.
* ``GET /readyz``: readiness. 200 once connected with its consumers created
  (``service.ready``), its connections up and this version's scripts in Redis (the function
  library ``baton load-functions`` loads, which a role user may not load itself); 503 before
  that, while reconnecting and while draining (so no new work is routed to a replica that
  is stopping).

Both answer a small JSON object with the checks. ``baton health`` checks a service from
outside: ``--port`` asks a local endpoint (container health checks), ``--role/--name`` reads
the service's announcement in ``<ns>:workers`` (fresh = seen within ``--max-age-s``). A probe
runs every few seconds, so its path imports neither aiohttp nor redis unless it needs them:
the ``--port`` check is a raw HTTP/1.1 GET over asyncio streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from baton.service import Service

__all__ = ["announcement_age_ms", "answer", "check_http", "health_command", "serve_health"]

_READ_TIMEOUT_S = 2.0


def answer(service: Service, method: str, path: str) -> tuple[int, dict[str, Any]]:
    """The status and body for one request (pure: the HTTP layer only frames it)."""
    if method != "GET":
        return 405, {"error": "GET only"}
    path = path.split("?", 1)[0]
    base = {"role": service.role, "name": service.name, "inflight": service.inflight}
    if path == "/healthz":
        return 200, {**base, "live": True, "draining": service.stopping.is_set()}
    if path == "/readyz":
        checks = service.health_checks()
        ready = all(checks.values())
        return (200 if ready else 503), {**base, "ready": ready, **checks}
    return 404, {"error": f"no such path {path}; try /healthz or /readyz"}


@contextlib.asynccontextmanager
async def serve_health(service: Service, port: int, host: str = "0.0.0.0") -> AsyncIterator[int]:
    """Serve /healthz and /readyz for ``service`` while the block runs; yields the port.

    An aiohttp.web application on the service's own event loop (so a wedged loop fails the
    probe); one catch-all route hands every request to :func:`answer`.
    """
    from aiohttp import web

    from baton.observability.log import get_logger

    async def handle(request: web.Request) -> web.Response:
        status, body = answer(service, request.method, request.path)
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    # No access log: orchestrators probe every few seconds. A short shutdown: probes are tiny.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = int(runner.addresses[0][1])  # the port given, or the one picked for 0
        get_logger("baton.health").info("health_serving", port=bound)
        yield bound
    finally:
        await runner.cleanup()


async def check_http(port: int, path: str = "/readyz", host: str = "127.0.0.1") -> tuple[int, str]:
    """GET a health endpoint: (status, body). Status 0 when nothing answers."""
    try:
        async with asyncio.timeout(_READ_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                         .encode())
            await writer.drain()
            raw = await reader.read()
            writer.close()
    except (TimeoutError, OSError) as exc:
        return 0, f"no answer on {host}:{port}: {exc or type(exc).__name__}"
    head, _, body = raw.decode("latin-1").partition("\r\n\r\n")
    try:
        return int(head.split()[1]), body
    except (IndexError, ValueError):
        return 0, f"not an HTTP answer: {raw[:100]!r}"


async def announcement_age_ms(redis: Any, keys: Any, role: str, name: str,
                              now: int) -> int | None:
    """How old the service's announcement (see baton.store.workers) is, or None if none."""
    field = f"{role}:{name}"
    raw = await redis.hget(keys.workers(field), field)
    if raw is None:
        return None
    return now - int(json.loads(raw).get("seen_ms", 0))


def _local_address() -> str:
    """Where a local service's endpoint answers: BATON_HEALTH_HOST unless it is a wildcard
    (read from the environment: the probe loads no settings for a port check)."""
    host = os.environ.get("BATON_HEALTH_HOST", "").strip()
    return "127.0.0.1" if host in ("", "0.0.0.0", "::", "*") else host


def _health_settings() -> Any:
    # Logging stays unconfigured: the check prints its own one line, and structlog (with the
    # rich console renderer it pulls in) would add about a third to the probe's CPU.
    from baton.devkit.stack import settings_from_env_or_stack

    return settings_from_env_or_stack(user="operator")  # read-only, like inspect


@click.command("health")
@click.option("--port", type=int, default=None,
              help="ask the /readyz (or --path) endpoint of a service on this local port")
@click.option("--host", default=None,
              help="the address to ask (default: BATON_HEALTH_HOST unless it is a wildcard, "
                   "else 127.0.0.1)")
@click.option("--path", default="/readyz", show_default=True, help="/readyz or /healthz")
@click.option("--role", type=click.Choice(["brain", "hands", "relay"]), default=None,
              help="check the announcement of this role's worker --name in Redis")
@click.option("--name", default=None, help="the worker name (BATON_WORKER_NAME)")
@click.option("--max-age-s", default=10.0, show_default=True,
              help="an announcement older than this is stale (services announce every 3.3 s)")
@click.option("--json", "as_json", is_flag=True, help="one JSON object: the answer")
def health_command(port: int | None, host: str | None, path: str, role: str | None,
                   name: str | None, max_age_s: float, as_json: bool) -> None:
    """Exit 0 if a service is healthy, 1 if not (for container and orchestrator checks)."""
    if port is not None:
        status, body = asyncio.run(check_http(port, path, host or _local_address()))
        if as_json:
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = {"error": body}
            click.echo(json.dumps({"port": port, "path": path, "status": status,
                                   "body": parsed}))
        else:
            click.echo(f"{path} on port {port}: "
                       + (f"{status} {body}" if status else body))
        sys.exit(0 if status == 200 else 1)
    if role is None or name is None:
        raise click.UsageError("give --port, or --role and --name")
    settings = _health_settings()

    async def age() -> int | None:
        from baton.store.keys import Keys
        from baton.store.redis_client import connect_redis

        redis = connect_redis(settings)
        try:
            seconds, micros = await redis.time()
            now = int(seconds) * 1000 + int(micros) // 1000
            return await announcement_age_ms(redis, Keys(settings.namespace, settings.shards),
                                             role, name, now)
        finally:
            await redis.aclose()

    try:
        found = asyncio.run(age())
    except Exception as exc:
        _report(as_json, {"role": role, "name": name, "healthy": False, "error": str(exc)},
                f"cannot read the announcements: {exc}")
        sys.exit(1)
    if found is None:
        _report(as_json, {"role": role, "name": name, "healthy": False, "age_ms": None},
                f"{role} {name}: no announcement (not running, or stopped cleanly)")
        sys.exit(1)
    fresh = found <= max_age_s * 1000
    _report(as_json, {"role": role, "name": name, "healthy": fresh, "age_ms": found},
            f"{role} {name}: last seen {found} ms ago ({'fresh' if fresh else 'stale'})")
    sys.exit(0 if fresh else 1)


def _report(as_json: bool, data: dict[str, Any], text: str) -> None:
    click.echo(json.dumps(data) if as_json else text)
