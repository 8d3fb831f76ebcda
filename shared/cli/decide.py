"""Operator decisions: ``baton cancel``, ``baton approve``, ``baton reject``.

Each is one idempotent script in the store (:mod:`baton.store.control`); a Brain carries the
decision out. Unknown sessions, tasks and runs are one-line errors naming the id.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from baton.cli.common import emit, json_option, run, settings
from baton.cli.failures import EXIT_TIMEOUT, CliError

if TYPE_CHECKING:
    from baton.client import Client

__all__ = ["approve", "cancel", "reject"]


async def _check_served(client: Client, session_id: str, kept: str) -> None:
    """Warn (stderr) when no live Brain serves the session's agent at its level: the
    session's own, or for a session not opened yet, that of the request that opens it."""
    from baton.cli.common import note
    from baton.store.store import now_ms
    from baton.store.workers import session_level, unserved

    store = client.store
    level = await session_level(store.redis, store.keys, session_id)
    if level is None:
        return
    if message := await unserved(store.redis, store.keys, now_ms(), *level):
        note(f"warning: {message}: {kept} and waits until one starts")


@click.command("cancel")
@click.argument("session_id")
@click.option("--task", "task_id", default=None, help="cancel this task (default: the session)")
@click.option("--reason", default="",
              help="the cancelled tasks end with it (and the cancel receipt records it)")
@click.option("--wait/--no-wait", default=False, help="wait until the cancelled work has ended")
@click.option("--timeout", default=60.0, show_default=True, help="seconds --wait waits")
@json_option
def cancel(session_id: str, task_id: str | None, reason: str, wait: bool,
           timeout: float, as_json: bool) -> None:
    """Cancel SESSION's tasks (or one --task): committed first, then carried out by a Brain.

    Idempotent: a repeated cancel answers "pending"; one of finished work "finished".
    """
    from baton.client import Client

    config = settings(log_level="warning")

    async def go() -> None:
        client = await Client.connect(config)
        try:
            answer = await client.cancel(session_id, task_id, reason=reason)
            target = (f"session {session_id}" if answer.target == "*"
                      else f"task {answer.target} of session {session_id}")
            emit(as_json, answer.to_dict(), f"cancel {answer.status}: {target}"
                 + (f" ({answer.outcome})" if answer.outcome else ""))
            if answer.status != "finished":  # a Brain carries it out: say when none can
                await _check_served(client, session_id, "the cancel is kept")
            if wait and answer.status != "finished":
                try:
                    ended = await client.wait_cancelled(session_id, task_id, timeout)
                except TimeoutError:
                    raise CliError(
                        f"the cancelled work of session {session_id} has not ended after "
                        f"{timeout:g} s; follow it with `baton watch {session_id}`",
                        EXIT_TIMEOUT) from None
                emit(as_json, {"ended": ended}, "cancelled work has ended")
        finally:
            await client.close()

    run(go())


@click.command("approve")
@click.argument("run_id")
@click.option("--session", "session_id", required=True, help="the run's session")
@click.option("--args-digest", "digest", default=None,
              help="the digest of the arguments you approve (shown by inspect)")
@click.option("--yes", is_flag=True, help="approve the shown arguments without asking")
@json_option
def approve(run_id: str, session_id: str, digest: str | None, yes: bool, as_json: bool) -> None:
    """Approve RUN, bound to its exact arguments; it is dispatched once.

    Without --args-digest, the run's arguments and digest are shown and confirmed first.
    """
    from baton.client import Client
    from baton.errors import not_found

    config = settings(log_level="warning")

    async def go() -> None:
        client = await Client.connect(config)
        try:
            chosen = digest
            if chosen is None:
                run_ = await client.store.runs.get(session_id, run_id)
                if run_ is None:
                    raise not_found(f"run {run_id} in session {session_id}",
                                    namespace=config.namespace, session_id=session_id)
                shown = {"run_id": run_id, "tool": run_.intent.tool,
                         "arguments": run_.intent.arguments,
                         "digest": run_.intent.approval_digest, "status": run_.status}
                # The arguments are what is being approved: always shown, on stderr when
                # stdout carries JSON results.
                click.echo(json.dumps(shown, indent=2, ensure_ascii=False), err=as_json)
                if not yes and not click.confirm("approve these arguments?", err=True):
                    raise click.Abort()
                chosen = run_.intent.approval_digest or ""
            seq = await client.approve(session_id, run_id, chosen)
            emit(as_json, {"run_id": run_id, "approved": True, "seq": seq},
                 f"approved {run_id} (commit {seq}): it is dispatched once")
        finally:
            await client.close()

    run(go())


@click.command("reject")
@click.argument("run_id")
@click.option("--session", "session_id", required=True, help="the run's session")
@click.option("--reason", default="", help="what the model (or task) is told")
@json_option
def reject(run_id: str, session_id: str, reason: str, as_json: bool) -> None:
    """Reject RUN awaiting approval: it ends with error code 'rejected'."""
    from baton.client import Client

    config = settings(log_level="warning")

    async def go() -> None:
        client = await Client.connect(config)
        try:
            seq = await client.reject(session_id, run_id, reason)
            emit(as_json, {"run_id": run_id, "rejected": True, "seq": seq},
                 f"rejected {run_id} (commit {seq})")
            await _check_served(client, session_id, "the rejection is kept")  # told by a Brain
        finally:
            await client.close()

    run(go())
