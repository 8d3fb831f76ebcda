"""``baton submit`` and ``baton start``: put input into a session, optionally wait for it.

Both are idempotent by ``--request-id``. Without ``--agent`` the input goes to an existing
session's own agent, else to the one agent the live Brains serve (their announcements); with
several, or none, they refuse and list what is served rather than guess. Before writing,
both read the services' announcements: with no live Brain serving the agent at that compat
level the input would wait (durably, but silently) until one starts, so they say so on
stderr, or refuse with ``--require-brain``. A wait that runs out names the submission, where
it stands, and the commands that show more; it never ends in a traceback.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import click

from baton.cli.common import emit, json_option, note, run, settings
from baton.cli.failures import EXIT_TIMEOUT, CliError

if TYPE_CHECKING:
    from baton.client import Client
    from baton.models import Submission, Task

__all__ = ["start", "submit"]


def _read_text(text: str) -> str:
    if text != "-":
        return text
    if sys.stdin.isatty():
        note("reading the text from stdin (end with Ctrl-D)")
    return sys.stdin.read()


async def _the_agent(client: Client, agent: str | None, session_id: str | None,
                     kind: str | None = None) -> str:
    """The agent input goes to: ``--agent``; else an existing session's own; else the one
    agent the live Brains serve (for ``start``: the one of those whose Brains run KIND).
    Several, or none served: a one-line refusal naming the agents the live Brains serve,
    never a guess (input for an agent nobody serves waits, durably but silently)."""
    if agent is not None:
        return agent
    from baton.store.store import now_ms
    from baton.store.workers import served_levels, services, session_level

    store = client.store
    if session_id and (level := await session_level(store.redis, store.keys, session_id)):
        return level[0]
    announced = await services(store.redis, store.keys, now_ms())
    served = sorted({a for a, _ in served_levels(announced)})
    if len(served) == 1:
        return served[0]
    if kind is not None and served:  # several: those whose live Brains announce KIND
        running = sorted({str(a) for s in announced if s.get("role") == "brain" and s["alive"]
                          and kind in s.get("kinds", ()) for a, _ in s.get("serves", ())})
        if len(running) == 1:
            return running[0]
    where = f"in namespace {store.keys.ns}"
    if not served:
        raise CliError(f"no live Brain serves any agent {where}: name the agent with --agent "
                       "(the input then waits until one of its Brains starts)")
    which = f" (task kind {kind!r} does not single one out)" if kind is not None else ""
    raise CliError(f"name the agent with --agent: the live Brains {where} serve "
                   f"{', '.join(served)}{which}")


async def _check_brains(client: Client, agent: str, compat: int, require: bool,
                        doing: str = "submitting", session_id: str | None = None,
                        kind: str = "generation") -> None:
    client.names.wake_subject(agent, compat)  # a name no subject takes fails first, alone
    client.warn_unserved = False  # said here, in the command's words
    # an existing session is served at its own level (a migration moves it)
    message = await client.waits(agent, compat, session_id=session_id, kind=kind)
    if not message:
        return
    if require:
        raise CliError(f"{message}; not {doing} (--require-brain)")
    note(f"warning: {message}: the input is kept and waits until one starts")


@contextlib.contextmanager
def _granted_sessions_hint(session_id: str | None, request_id: str | None) -> Iterator[None]:
    """A client credential granted some sessions only (``baton auth
    --client-sessions 'acme-*'``) is refused a session id it did not choose: say so."""
    from baton.errors import ForbiddenError

    try:
        yield
    except ForbiddenError as exc:
        if session_id:
            raise CliError(f"{exc.message} (is session {session_id} outside this "
                           "credential's granted sessions?)") from None
        raise CliError(f"{exc.message} (without --session the session id is made up"
                       f"{' from the request id' if request_id else ''}; a credential "
                       "granted some sessions only, e.g. 'acme-*', needs --session with one "
                       "of them)") from None


def _sub_text(sub: Submission, created: bool) -> str:
    head = "submitted" if created else "already submitted (same request id)"
    return (f"{head} {sub.id} to session {sub.session_id} (agent {sub.agent}, "
            f"request id {sub.request_id})")


def _final_text(sub: Submission) -> str:
    if sub.status == "completed":
        return f"{sub.status}: {sub.answer or ''}"
    return f"{sub.status}: {sub.error or sub.answer or '(no detail)'}"


def _timed_out(what: str, session_id: str, status: str, timeout: float,
               exc: BaseException | None = None) -> CliError:
    why = getattr(exc, "why", "")  # what it most likely waits for (Client.wait found out)
    return CliError(
        f"{what} in session {session_id} is still {status} after {timeout:g} s"
        f"{f' ({why})' if why else ''}; follow it with `baton watch {session_id}` or see "
        f"its timeline with `baton trace {session_id}`", EXIT_TIMEOUT)


@click.command()
@click.option("--agent", default=None,
              help="the session's agent (default: an existing session's own, else the one "
                   "agent the live Brains serve; several or none: name it)")
@click.option("--compat", default=1, show_default=True, type=click.IntRange(min=1),
              help="the session's compat level (1 or more, as an Agent's)")
@click.option("--session", "session_id", default=None, help="session id (default: new)")
@click.option("--request-id", default=None,
              help="idempotency key: the same id and text give the same submission (in the "
                   "session derived from the id when --session is not given); the same id "
                   "with another text is a conflict")
@click.option("--wait/--no-wait", default=False, help="wait for the final answer")
@click.option("--timeout", default=60.0, show_default=True, help="seconds --wait waits")
@click.option("--require-brain", is_flag=True,
              help="refuse (exit 1) when no live Brain serves the agent at that level")
@click.option("--tenant", default=None,
              help="whose work a new session is, for fair admission (default: BATON_TENANT)")
@click.option("--priority", default=3, show_default=True, type=click.IntRange(1, 5),
              help="a new session's admission priority: 1 first .. 5 last")
@json_option("the submission; with --wait, then its settled state", lines=True)
@click.argument("text")
def submit(agent: str | None, compat: int, session_id: str | None, request_id: str | None,
           wait: bool, timeout: float, require_brain: bool, tenant: str | None,
           priority: int, as_json: bool, text: str) -> None:
    """Submit TEXT to a session (TEXT `-` reads it from stdin).

    Prints the submission; with --wait, then its settled state (exit 1 unless completed,
    124 if it did not settle within --timeout).
    """
    from baton.client import Client

    body = _read_text(text)
    if not body.strip():  # before any connection: nothing to look up for it
        raise CliError("nothing to submit: the text is empty")
    config = settings("client", log_level="warning")

    async def go() -> int:
        client = await Client.connect(config)
        try:
            with _granted_sessions_hint(session_id, request_id):
                name = await _the_agent(client, agent, session_id)
                await _check_brains(client, name, compat, require_brain,
                                    session_id=session_id)
                sub, created = await client.submit(body, agent=name, compat=compat,
                                                   session_id=session_id,
                                                   request_id=request_id, tenant=tenant,
                                                   priority=priority)
            emit(as_json, {**sub.model_dump(mode="json"), "created": created},
                 lambda: _sub_text(sub, created))
            if not wait:
                return 0
            try:
                final = await client.wait(sub, timeout)
            except TimeoutError as exc:
                now = await client.store.inbox.submission(sub.session_id, sub.id)
                raise _timed_out(f"submission {sub.id}", sub.session_id, now.status,
                                 timeout, exc) from None
            emit(as_json, final.model_dump(mode="json"), lambda: _final_text(final))
            return 0 if final.status == "completed" else 1
        finally:
            await client.close()

    sys.exit(run(go()))


@click.command("start")
@click.argument("kind")
@click.option("--input", "input_json", default="{}", show_default=True,
              help="the task's input, a JSON object")
@click.option("--session", "session_id", default=None, help="session id (default: new)")
@click.option("--agent", default=None,
              help="the session's agent (default: an existing session's own, else the one "
                   "agent the live Brains serve, or the one of those whose Brains run KIND)")
@click.option("--compat", default=1, show_default=True, type=click.IntRange(min=1),
              help="the session's compat level (1 or more, as an Agent's)")
@click.option("--request-id", default=None, help="idempotency key of this start")
@click.option("--wait/--no-wait", default=False, help="wait until the task has ended")
@click.option("--timeout", default=60.0, show_default=True, help="seconds --wait waits")
@click.option("--require-brain", is_flag=True,
              help="refuse (exit 1) when no live Brain serves the agent at that level or "
                   "knows KIND")
@click.option("--tenant", default=None,
              help="whose work a new session is, for fair admission (default: BATON_TENANT)")
@click.option("--priority", default=3, show_default=True, type=click.IntRange(1, 5),
              help="a new session's admission priority: 1 first .. 5 last")
@json_option("the start; with --wait, then the ended task", lines=True)
def start(kind: str, input_json: str, session_id: str | None, agent: str | None, compat: int,
          request_id: str | None, wait: bool, timeout: float, require_brain: bool,
          tenant: str | None, priority: int, as_json: bool) -> None:
    """Start a root task of KIND (a custom task the app registers) in a session."""
    from baton.client import Client

    try:
        task_input = json.loads(input_json)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--input") from None
    if not isinstance(task_input, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--input")
    config = settings("client", log_level="warning")

    async def go() -> int:
        client = await Client.connect(config)
        try:
            with _granted_sessions_hint(session_id, request_id):
                name = await _the_agent(client, agent, session_id, kind)
                await _check_brains(client, name, compat, require_brain, "starting",
                                    session_id, kind)
                sid, task_id, created = await client.start_task(
                    session_id, kind, task_input, agent=name, compat=compat,
                    request_id=request_id, tenant=tenant, priority=priority)
            head = "started" if created else "already started (same request id)"
            emit(as_json, {"session_id": sid, "task_id": task_id, "created": created},
                 f"{head} task {task_id} ({kind}) in session {sid}")
            if not wait:
                return 0
            try:
                task = await client.wait_task(sid, task_id, timeout)
            except TimeoutError as exc:
                now = await client.store.inbox.task(sid, task_id)
                raise _timed_out(f"task {task_id}", sid, now.state.name, timeout,
                                 exc) from None
            ok = task.state.name == "terminal" and task.state.outcome == "completed"
            emit(as_json, task.model_dump(mode="json"), lambda: _task_text(task))
            return 0 if ok else 1
        finally:
            await client.close()

    sys.exit(run(go()))


def _task_text(task: Task) -> str:
    state = task.state
    outcome = state.outcome if state.name == "terminal" else state.name
    reason = state.reason if state.name == "terminal" else ""
    result = json.dumps(task.result, default=str) if task.result is not None else ""
    return f"task {task.id} {outcome}" + (f": {reason}" if reason else "") + (
        f" {result}" if result else "")
