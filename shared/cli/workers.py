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

    Runs `python -m bench [all | NAME ...] [--quick]` in the source checkout (the benchmarks
    ship with the sources): a table per benchmark, every figure beside its target, JSON and
    an SVG picture in bench/results/.
    """
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    if not (root / "bench" / "__main__.py").exists():
        raise click.ClickException("the benchmarks ship with the source tree: run "
                                   "`baton bench` from a checkout (make bench)")
    sys.exit(subprocess.call([sys.executable, "-m", "bench", *(args or ("all",))], cwd=root))
