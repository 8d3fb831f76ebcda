"""``baton brain``, ``baton hands``, ``baton relay``: the services' entry points; and ``bench``."""

from __future__ import annotations

import sys

import click

from baton.cli.common import run, settings

__all__ = ["bench", "brain", "hands", "relay"]


@click.command()
@click.option("--app", "app_spec", required=True, help="module:attribute of the App")
@click.option("--name", default=None, help="worker name (default: brain-<host>-<pid>)")
def brain(app_spec: str, name: str | None) -> None:
    """Run a Brain worker: consumes wakes, runs sessions' tasks under leases."""
    from baton.brain.worker import main as brain_main

    run(brain_main(settings("brain", worker_name=name), app_spec))


@click.command()
@click.option("--app", "app_spec", required=True, help="module:attribute of the App")
@click.option("--tools", default=None, help="comma-separated tools to serve (default: all)")
@click.option("--name", default=None, help="worker name (default: hands-<host>-<pid>)")
def hands(app_spec: str, tools: str | None, name: str | None) -> None:
    """Run a Hands worker: executes tool runs under attempt fences."""
    from baton.hands.worker import main as hands_main

    served = [t.strip() for t in tools.split(",") if t.strip()] if tools else None
    run(hands_main(settings("hands", worker_name=name), app_spec, served))


@click.command()
@click.option("--name", default=None, help="worker name (default: relay-<host>-<pid>)")
def relay(name: str | None) -> None:
    """Run an outbox relay: publishes committed outbox rows, fires timers."""
    from baton.relay.worker import main as relay_main

    run(relay_main(settings("relay", worker_name=name)))


@click.command("bench", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args: tuple[str, ...]) -> None:
    """Benchmarks side by side: chain, tool round trip, sessions/s, takeover, step cost.

    Runs `python -m baton.bench [all | NAME ...] [--quick]` (installed with Baton) in its own
    process: a table per benchmark, every figure beside its target, JSON and an SVG picture
    in ./bench/results/ of the current directory, or in $BATON_BENCH_RESULTS.
    """
    import subprocess

    sys.exit(subprocess.call([sys.executable, "-m", "baton.bench", *(args or ("all",))]))
