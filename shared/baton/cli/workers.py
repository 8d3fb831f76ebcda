"""``baton brain``, ``baton hands``, ``baton relay``: the services' entry points; and ``bench``."""

from __future__ import annotations

import sys

import click

from baton.bus.lean import import_service_libraries
from baton.cli.common import json_logs_option, run, settings

__all__ = ["bench", "brain", "hands", "relay"]


@click.command()
@click.option("--app", "app_spec", required=True, help="module:attribute of the App")
@click.option("--name", default=None, help="worker name (default: brain-<host>-<pid>)")
@json_logs_option
def brain(app_spec: str, name: str | None, as_json: bool) -> None:
    """Run a Brain worker: consumes wakes, runs sessions' tasks under leases."""
    import_service_libraries()
    from baton.brain.worker import main as brain_main

    found = settings("brain", worker_name=name, log_format=_logs(as_json))
    run(brain_main(found, app_spec), event_loop=found.event_loop)


@click.command()
@click.option("--app", "app_spec", required=True, help="module:attribute of the App")
@click.option("--tools", default=None, help="comma-separated tools to serve (default: all)")
@click.option("--name", default=None, help="worker name (default: hands-<host>-<pid>)")
@json_logs_option
def hands(app_spec: str, tools: str | None, name: str | None, as_json: bool) -> None:
    """Run a Hands worker: executes tool runs under attempt fences."""
    import_service_libraries()
    from baton.hands.worker import main as hands_main

    served = [t.strip() for t in tools.split(",") if t.strip()] if tools else None
    found = settings("hands", worker_name=name, log_format=_logs(as_json))
    run(hands_main(found, app_spec, served), event_loop=found.event_loop)


@click.command()
@click.option("--name", default=None, help="worker name (default: relay-<host>-<pid>)")
@json_logs_option
def relay(name: str | None, as_json: bool) -> None:
    """Run an outbox relay: publishes committed outbox rows, fires timers."""
    import_service_libraries()
    from baton.relay.worker import main as relay_main

    found = settings("relay", worker_name=name, log_format=_logs(as_json))
    run(relay_main(found), event_loop=found.event_loop)


def _logs(as_json: bool) -> str | None:
    """The log format ``--json`` asks for (None: the settings' own, by default auto)."""
    return "json" if as_json else None


@click.command("bench", context_settings={"ignore_unknown_options": True})
@click.option("--json", "as_json", is_flag=True,
              help="JSON Lines: each benchmark's result (tables go to stderr)")
@click.argument("args", metavar="[NAME ...] [--quick] [--list]", nargs=-1,
                type=click.UNPROCESSED)
def bench(as_json: bool, args: tuple[str, ...]) -> None:
    """Benchmarks side by side: chain, tool round trip, sessions/s, takeover, step cost.

    Runs `python -m baton.bench [all | NAME ...] [--quick] [--list]` (installed with Baton)
    in its own process: a table per benchmark, every figure beside its target, JSON and an
    SVG picture in ./bench/results/ of the current directory, or in $BATON_BENCH_RESULTS.
    """
    import subprocess

    argv = [*(args or ("all",)), *(["--json"] if as_json else [])]
    sys.exit(subprocess.call([sys.executable, "-m", "baton.bench", *argv]))
