"""Every ``baton`` command takes ``--json``: enumerated from the CLI's registry, so a command
added later without it fails here."""

from __future__ import annotations

import os
import subprocess
import sys
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


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """``baton ... | head``: output written after the reader closed its end is no error to
    report (it used to surface as "cannot connect: Broken pipe"), and no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "baton", "inspect", "--help"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "BATON_DEBUG": ""})
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1
    assert err == "", err
