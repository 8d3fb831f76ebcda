"""What every client command shares: finding the stack, running a coroutine, printing results.

Results go to stdout, readable by a person by default and one JSON document per result with
``--json`` (for scripts); notes and warnings go to stderr, so stdout stays clean to pipe.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from baton.cli.failures import CliError, end_if_the_reader_went_away, failure

if TYPE_CHECKING:
    from baton.settings import Settings

__all__ = ["JSON_LINES", "JSON_OBJECT", "confirmed", "emit", "json_logs_option",
           "json_option", "note", "resolve_run", "run", "settings"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


#: How every ``--json`` help text starts (docs/cli.md): a stream of results, or one result.
JSON_LINES = "JSON Lines: "
JSON_OBJECT = "one JSON object: "


def json_option(what: str = "the result", *, lines: bool = False) -> Callable[[F], F]:
    """``--json``: the command's results as JSON on stdout instead of text (notes and
    warnings stay on stderr). ``lines``: a stream (or sequence) of results, one JSON object
    per line; else the single result, one JSON object on one line."""
    return click.option("--json", "as_json", is_flag=True,
                        help=(JSON_LINES if lines else JSON_OBJECT) + what)


def json_logs_option(f: F) -> F:
    """``--json`` for a long-running service: its output is its log, JSON lines even on a
    terminal (without the flag: JSON whenever stderr is not a terminal, readable on one)."""
    return click.option("--json", "as_json", is_flag=True,
                        help=JSON_LINES + "the service's log (stderr), also on a terminal")(f)


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
        if "baton.observability.telemetry" in sys.modules:
            sys.modules["baton.observability.telemetry"].shutdown()  # flush batched spans


def emit(as_json: bool, data: Any, text: str | Callable[[], str]) -> None:
    """One result: ``data`` as a JSON line with ``--json``, else ``text`` for a person."""
    if as_json:
        click.echo(json.dumps(data, default=str))
    else:
        click.echo(text() if callable(text) else text)


def confirmed(question: str) -> bool:
    """The person's yes or no, asked on stderr; no answer at all (stdin closed) is a no."""
    try:
        answer = click.confirm(question, err=True)
    except click.Abort as exc:  # click's word for both Ctrl-C and end of input
        click.echo(err=True)
        if isinstance(exc.__context__, KeyboardInterrupt):
            raise SystemExit(130) from None
        return False
    if not sys.stdin.isatty():  # a piped answer is not echoed: end the question's line
        click.echo(err=True)
    return answer


def note(message: str) -> None:
    """A remark for the person at the terminal (stderr: never mixed into piped results)."""
    click.echo(message, err=True)


def fail(message: str, exit_code: int = 1) -> CliError:
    return CliError(message, exit_code)


def resolve_run(given: str, run_ids: Iterable[str]) -> str:
    """The full id of the session's run that ``--run`` names: its full id, or a short form
    as trace and inspect print it, ``<turn>-<n>`` (``2-0``) or ``<end of task id>/<turn>-<n>``
    (``a1b2c3/2-0``). A short form two runs share is a one-line error naming both; one no run
    has comes back as given, so the command reports it unknown in its own words."""
    known = set(run_ids)
    if given in known:
        return given
    task_end, _, tail = given.rpartition("/")
    matches = sorted(rid for rid in known
                     if len(parts := rid.rsplit("-", 2)) == 3
                     and f"{parts[1]}-{parts[2]}" == tail and parts[0].endswith(task_end))
    if len(matches) > 1:
        raise CliError(f"run {given} is ambiguous: it could be {', '.join(matches)}; "
                       "give one of these full ids")
    return matches[0] if matches else given
