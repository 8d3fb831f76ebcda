"""Every ``baton`` command takes ``--json``: enumerated from the CLI's registry, so a command
added later without it fails here."""

from __future__ import annotations

from collections.abc import Iterator

import click

from baton.cli.main import COMMANDS, main


def _commands() -> Iterator[tuple[str, click.Command]]:
    ctx = click.Context(main)
    for name in COMMANDS:
        command = main.get_command(ctx, name)
        assert command is not None, name
        yield name, command
        if isinstance(command, click.Group):
            for sub, subcommand in command.commands.items():
                yield f"{name} {sub}", subcommand


def test_every_command_and_subcommand_takes_json() -> None:
    names = dict(_commands())
    assert {"dev up", "dev down", "dev status", "dev logs"} <= set(names)
    missing = [name for name, command in names.items()
               if not any("--json" in param.opts for param in command.params)]
    assert not missing, f"no --json on: {', '.join(missing)}"
