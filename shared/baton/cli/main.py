"""The ``baton`` command line: services, the dev stack, and client commands.

Only this registry is imported to parse a command line or print ``baton --help``; each
command's module (and with it redis, nats, rich, pydantic models, OpenTelemetry) is imported
when that command runs (:class:`~baton.cli.lazy.LazyGroup`).
"""

from __future__ import annotations

import click

from baton.cli.lazy import LazyGroup

__all__ = ["COMMANDS", "SECTIONS", "main"]

#: The sections of ``baton --help``, in order: each command's name -> ("module:attribute",
#: the one-line help shown there). The convention every command follows is docs/cli.md.
SECTIONS: dict[str, dict[str, tuple[str, str]]] = {
    "Services (long-running; one per process)": {
        "brain": ("baton.cli.workers:brain", "Run a Brain worker: consumes wakes, runs sessions."),
        "hands": ("baton.cli.workers:hands", "Run a Hands worker: executes tool runs."),
        "relay": ("baton.cli.workers:relay",
                  "Run an outbox relay: publishes rows, fires timers."),
        "api": ("baton.api.server:api_command", "Serve the HTTP API and the web console."),
        "health": ("baton.observability.health:health_command",
                   "Exit 0 if a service is healthy, 1 if not."),
    },
    "Sessions (put work in, decide on it)": {
        "submit": ("baton.cli.submit:submit", "Submit TEXT (or - for stdin) to a session."),
        "start": ("baton.cli.submit:start", "Start a root task of KIND in a session."),
        "cancel": ("baton.cli.decide:cancel", "Cancel SESSION's tasks (or one --task)."),
        "approve": ("baton.cli.decide:approve",
                    "Approve SESSION's tool --run awaiting approval."),
        "reject": ("baton.cli.decide:reject", "Reject SESSION's tool --run awaiting approval."),
    },
    "Operate (read what happened, administer the stores)": {
        "inspect": ("baton.cli.observe:inspect_command", "Tasks, runs, leases; or the cluster."),
        "trace": ("baton.cli.observe:trace_command", "The handoff timeline of a session."),
        "watch": ("baton.cli.observe:watch_command", "A session's snapshot, then its changes."),
        "auth": ("baton.cli.auth:auth_command",
                 "Write the NATS users and Redis ACL files of a namespace."),
        "load-functions": ("baton.cli.functions:load_functions_command",
                           "Load the scripts into Redis as functions (as its admin)."),
        "make-tls": ("baton.devkit.tls:make_tls_command",
                     "Make a private CA and a certificate for a cluster's hosts."),
        "accept-loss": ("baton.cli.recover:accept_loss",
                        "After Redis lost shards: accept it, so workers start again."),
    },
    "Develop (a local stack, demos, tests)": {
        "dev": ("baton.devkit.dev:dev_command", "The local stack: dev up | down | status | logs."),
        "demo": ("baton.devkit.demo:demo_command", "Five notices, a Hands killed mid-send."),
        "chaos": ("baton.devkit.chaos:chaos_command", "Many sessions while killing workers."),
        "mailbox": ("baton.devkit.mailbox:mailbox_command", "Run the bundled mail service."),
        "bench": ("baton.cli.workers:bench", "Benchmarks side by side (installed with Baton)."),
    },
}

#: name -> ("module:attribute", one-line help): every command, whatever its section.
COMMANDS: dict[str, tuple[str, str]] = {
    name: entry for section in SECTIONS.values() for name, entry in section.items()}


@click.group(cls=LazyGroup, lazy=COMMANDS,
             sections={title: list(names) for title, names in SECTIONS.items()})
@click.version_option(package_name="baton")
@click.option("--debug", is_flag=True, envvar="BATON_DEBUG",
              help="show tracebacks instead of one-line errors (or BATON_DEBUG=1)")
def main(debug: bool) -> None:
    """Baton: durable Brain/Hands agents over NATS JetStream and Redis."""


if __name__ == "__main__":
    main()
