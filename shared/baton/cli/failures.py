"""How a failed command reads: one sentence on stderr and an exit code, never a traceback.

Operators run ``baton`` against stacks that may be down, with ids they typed by hand. Every
error that is about their input or their stack (a :class:`~baton.errors.BatonError`, a
refused connection, a timeout) becomes :class:`CliError`: ``error: <sentence>`` plus, where
it helps, what to run next. Anything else is a bug in Baton; it is reported on one line too,
with the hint to rerun with ``--debug`` (or ``BATON_DEBUG=1``) for the traceback.

Exit codes: 1 for errors, 2 for usage (click's), 3 when a server cannot be reached, 124 when a
wait timed out (the ``timeout`` command's code), 130 on Ctrl-C.
"""

from __future__ import annotations

import os
import sys
from typing import IO, Any

import click

__all__ = ["EXIT_TIMEOUT", "EXIT_UNAVAILABLE", "CliError", "end_if_the_reader_went_away",
           "failure", "no_stack_hint", "url_source_hint"]

EXIT_UNAVAILABLE = 3
EXIT_TIMEOUT = 124


class CliError(click.ClickException):
    """A one-line error with its own exit code."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        # click declares exit_code on the class; this error carries its own per instance.
        setattr(self, "exit_code", exit_code)  # noqa: B010

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", file=file, err=file is None)


def end_if_the_reader_went_away(exc: BaseException) -> None:
    """End the command quietly with exit 1 when ``exc`` is stdout's reader closing its end
    (``baton ... | head``), alone or as a task group's one failure: no error of the
    command's, though the OS calls it a ConnectionError ("Broken pipe"), and nobody is left
    to tell; the interpreter's last flush of stdout must not complain either."""
    if isinstance(_sole(exc), BrokenPipeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1)


def _sole(exc: BaseException) -> BaseException:
    """A task group's one failure as itself (nested groups too); anything else unchanged."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def no_stack_hint(env: dict[str, str] | None = None) -> str:
    """What to do when the servers cannot be reached and nothing says where a stack is."""
    from baton.devkit.stack import stack_file

    env = dict(os.environ) if env is None else env
    if env.get("BATON_REDIS_URL") or stack_file(env).exists():
        return ""
    return (f" (no BATON_REDIS_URL set and no stack described in {stack_file(env)}; "
            "start one with `baton dev up`)")


#: The variables a server's URL is read from, in the order the commands read them
#: (:func:`~baton.devkit.stack.settings_from_env_or_stack`); the stack's dev.json is the fallback.
_URL_VARIABLES = {"redis": ("BATON_OPERATOR_REDIS_URL", "BATON_REDIS_URL"),
                 "nats": ("BATON_NATS_URL",)}


def url_source_hint(server: str, url: str, env: dict[str, str] | None = None) -> str:
    """Where the unreachable ``url`` of ``server`` (``redis`` or ``nats``) came from.

    A variable exported for an earlier stack (``eval "$(baton dev status --env)"``) wins over
    the stack started since, and then every command fails against a port nothing listens on:
    the hint names the variable and the local stack's own URL, so the cause is on the line.
    """
    from baton.devkit.stack import bare_url, read_stack, servers, stack_file

    env = dict(os.environ) if env is None else env
    name = next((name for name in _URL_VARIABLES[server]
                 if env.get(name) and servers(env[name]) == servers(url)), None)
    stack = read_stack(env) or {}
    theirs = str(stack.get(f"{server}_url") or "")
    if name is None:
        if theirs and servers(theirs) == servers(url):
            return (f" (the stack's, from {stack_file(env)}: `baton dev status` says "
                    "whether it runs)")
        return no_stack_hint(env)
    if not theirs:
        return f" ({name} from the environment)"
    if servers(theirs) == servers(url):
        return (f" ({name} from the environment, the local stack's: `baton dev status` says "
                "whether it runs)")
    return (f" ({name} from the environment; the local stack's is {bare_url(theirs)} if a "
            "stack runs: "
            "see `baton dev status`)")


def failure(exc: BaseException) -> CliError:
    """The :class:`CliError` an escaped exception becomes."""
    from baton.errors import BatonError, NatsUnavailable, RedisUnavailable, UnavailableError

    if isinstance(exc, CliError):
        return exc
    exc = _sole(exc)  # a task group's one failure reads as itself
    module = type(exc).__module__
    if not isinstance(exc, BatonError) and module.startswith("redis"):
        from baton.errors import from_redis_error

        exc = from_redis_error(exc if isinstance(exc, Exception) else Exception(str(exc)))
    elif not isinstance(exc, BatonError) and module.startswith("nats"):
        exc = NatsUnavailable(f"NATS: {exc or type(exc).__name__}")
    if isinstance(exc, UnavailableError):
        url = getattr(exc, "url", "")  # set by a connect that failed, with the URL it tried
        server = ("redis" if isinstance(exc, RedisUnavailable)
                  else "nats" if isinstance(exc, NatsUnavailable) else "")
        hint = url_source_hint(server, url) if url and server else no_stack_hint()
        return CliError(f"{exc.message}{hint}", EXIT_UNAVAILABLE)
    if isinstance(exc, BatonError):
        return CliError(exc.message)
    if isinstance(exc, TimeoutError):
        return CliError("timed out" + (f": {exc}" if str(exc) else ""), EXIT_TIMEOUT)
    if isinstance(exc, ConnectionError):
        return CliError(f"cannot connect: {exc}{no_stack_hint()}", EXIT_UNAVAILABLE)
    if isinstance(exc, OSError):
        return CliError(f"{exc.strerror or exc}"
                        + (f": {exc.filename}" if exc.filename else ""))
    return CliError(f"unexpected {type(exc).__name__}: {exc} "
                    "(a bug in baton; rerun with --debug or BATON_DEBUG=1 for the traceback)")
