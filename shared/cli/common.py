"""What every client command shares: finding the stack, running a coroutine, printing results.

Results go to stdout, readable by a person by default and one JSON document per result with
``--json`` (for scripts); notes and warnings go to stderr, so stdout stays clean to pipe.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import click

from baton.cli.failures import CliError, end_if_the_reader_went_away, failure

if TYPE_CHECKING:
    from baton.settings import Settings

__all__ = ["emit", "json_logs_option", "json_option", "note", "run", "settings"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def json_option(f: F) -> F:
    """``--json``: print results as JSON (one document per line) instead of text."""
    return click.option("--json", "as_json", is_flag=True,
                        help="print results as JSON, one object per line")(f)


def json_logs_option(f: F) -> F:
    """``--json`` for a long-running service: its output is its log, JSON lines even on a
    terminal (without the flag: JSON whenever stderr is not a terminal, readable on one)."""
    return click.option("--json", "as_json", is_flag=True,
                        help="log JSON lines even on a terminal")(f)


def settings(role: str = "", log_level: str | None = None, *, user: str = "client",
             **overrides: Any) -> Settings:
    """Settings from ``BATON_*`` or the running ``baton dev``, and logging; with ``role``,
    OpenTelemetry from the ``OTEL_*`` variables too (nothing when none is set; flushed by
    :func:`run`). ``user="operator"``: the operator's credential where one is configured
    (the read-only commands; see :func:`~baton.devkit.stack.settings_from_env_or_stack`)."""
    from baton.devkit.stack import settings_from_env_or_stack
    from baton.errors import BatonError
    from baton.observability import log as logs

    try:
        found = settings_from_env_or_stack(user, **overrides)
    except BatonError as exc:
        raise failure(exc) from None
    logs.configure(log_level or found.log_level, found.log_format)
    if role:
        from baton.observability import telemetry

        telemetry.setup(role, found)
    return found


def loop_factory(event_loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop factory for the ``event_loop`` setting (None: asyncio's default).

    ``uvloop`` fails with a clear error when it is not installed; ``auto`` takes it when it is.
    """
    if event_loop == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if event_loop == "auto":
            return None
        from baton.errors import ConfigError

        raise failure(ConfigError(
            "BATON_EVENT_LOOP=uvloop but uvloop is not installed (pip install uvloop)")) from None
    return uvloop.new_event_loop


def run(coro: Coroutine[Any, Any, T], *, event_loop: str = "asyncio") -> T:
    """Run a command's coroutine; its errors become one-line :class:`CliError` s.

    ``event_loop``: the loop to run it on (the setting of that name; the services pass it).
    """
    try:
        with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
            return runner.run(coro)
    except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
        raise
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except Exception as exc:
        from baton.cli.lazy import debugging

        end_if_the_reader_went_away(exc)  # ``submit --wait | head -1``: not "cannot connect"
        if debugging(click.get_current_context(silent=True)):
            raise
        raise failure(exc) from None
    finally:
        import sys

        if "baton.observability.telemetry" in sys.modules:
            sys.modules["baton.observability.telemetry"].shutdown()  # flush batched spans


def emit(as_json: bool, data: Any, text: str | Callable[[], str]) -> None:
    """One result: ``data`` as a JSON line with ``--json``, else ``text`` for a person."""
    if as_json:
        click.echo(json.dumps(data, default=str))
    else:
        click.echo(text() if callable(text) else text)


def note(message: str) -> None:
    """A remark for the person at the terminal (stderr: never mixed into piped results)."""
    click.echo(message, err=True)


def fail(message: str, exit_code: int = 1) -> CliError:
    return CliError(message, exit_code)
