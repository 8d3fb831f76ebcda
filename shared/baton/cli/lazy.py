"""A click group whose subcommands are imported on first use, and fail without a traceback.

``baton --help`` and a health probe should cost what Python and click cost, not the import of
redis, nats, rich, pydantic models and the OpenTelemetry SDK that other commands need. Each
subcommand is named by ``"module:attribute"`` with its one-line help beside it, so the help
listing never imports a command (click's "lazy loading subcommands" pattern, plus the
listing).

The group also owns the last line of defence for errors: a :class:`~baton.errors.BatonError`
or a connection failure that escaped a command becomes one ``error: ...`` line on stderr and
a non-zero exit (see :mod:`baton.cli.failures`); ``--debug`` or ``BATON_DEBUG=1`` lets the
traceback through instead.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import click

__all__ = ["LazyGroup"]


class LazyGroup(click.Group):
    """A group of ``name -> (import path, short help)`` subcommands, loaded when invoked."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]] | None = None,
                 sections: dict[str, list[str]] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})
        #: title -> command names, in the order ``--help`` lists them (others: "Commands")
        self.sections = dict(sections or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            path = self.lazy[cmd_name][0]
            module, _, attr = path.partition(":")
            command = getattr(importlib.import_module(module), attr)
            if not isinstance(command, click.Command):
                raise TypeError(f"{path} is not a click command")
            self.commands[cmd_name] = command
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The listing, by section, from the registered short help: no subcommand is
        imported for it."""
        listed = set(self.list_commands(ctx))
        grouped = [(title, [n for n in names if n in listed])
                   for title, names in self.sections.items()]
        placed = {name for _, names in grouped for name in names}
        grouped.append(("Commands", [n for n in sorted(listed) if n not in placed]))
        for title, names in grouped:
            rows = []
            for name in names:
                if name in self.commands:
                    command = self.commands[name]
                    if command.hidden:
                        continue
                    rows.append((name, command.get_short_help_str(formatter.width)))
                else:
                    rows.append((name, self.lazy[name][1]))
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            raise SystemExit(130) from None
        except Exception as exc:
            from baton.cli.failures import end_if_the_reader_went_away, failure

            end_if_the_reader_went_away(exc)  # ``baton trace --json | head``
            if debugging(ctx):
                raise
            raise failure(exc) from None


def debugging(ctx: click.Context | None = None) -> bool:
    """``--debug`` on the command line or ``BATON_DEBUG=1``: show tracebacks."""
    root = ctx.find_root() if ctx is not None else None
    if root is not None and root.params.get("debug"):
        return True
    return os.environ.get("BATON_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")
