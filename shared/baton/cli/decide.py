"""Operator decisions: ``baton cancel``, ``baton approve``, ``baton reject``.

Each is one idempotent script in the store (:mod:`baton.store.control`); a Brain carries the
decision out. Unknown sessions, tasks and runs are one-line errors naming the id.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from baton.cli.common import confirmed, emit, json_option, resolve_run, run, settings
from baton.cli.failures import EXIT_TIMEOUT, CliError

if TYPE_CHECKING:
    from baton.client import Client

__all__ = ["approval_prompt", "approve", "cancel", "reject"]


def approval_prompt(run_id: str, tool: str, arguments: dict[str, Any], digest: str | None,
                    status: str) -> str:
    """What ``approve`` shows before it asks: the run, its tool and each argument on a line
    of its own (the value as JSON, so a string's quotes and a nested object read exactly as
    they are bound by the digest)."""
    lines = [f"run {run_id} ({status}) calls {tool} with:"]
    for name, value in arguments.items():
        shown = json.dumps(value, indent=2, ensure_ascii=False, default=str)
        lines.append(f"  {name}: " + shown.replace("\n", "\n    "))
    if not arguments:
        lines.append("  (no arguments)")
    lines.append(f"args digest: {digest or '(none)'}")
    return "\n".join(lines)


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


async def _full_run_id(client: Client, session_id: str, given: str) -> str:
    """``--run`` as its full id: trace prints runs short (``2-0``), and either form is taken."""
    runs = client.store.runs
    return resolve_run(given, [*await runs.live(session_id), *await runs.applied(session_id)])


@click.command("cancel")
@click.argument("session_id", metavar="SESSION")
@click.option("--task", "task_id", default=None, help="cancel this task (default: the session)")
@click.option("--reason", default="",
              help="the cancelled tasks end with it (and the cancel receipt records it)")
@click.option("--wait/--no-wait", default=False, help="wait until the cancelled work has ended")
@click.option("--timeout", default=60.0, show_default=True, help="seconds --wait waits")
@json_option("the cancel's answer; with --wait, then {\"ended\": ...}", lines=True)
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
@click.argument("session_id", metavar="SESSION")
@click.option("--run", "run_id", required=True,
              help="the tool run to approve: its id, or the short form trace prints (2-0)")
@click.option("--args-digest", "digest", default=None,
              help="the digest of the arguments you approve (shown by inspect)")
@click.option("--yes", is_flag=True, help="approve the shown arguments without asking")
@json_option("the approval (the arguments shown go to stderr)")
def approve(session_id: str, run_id: str, digest: str | None, yes: bool, as_json: bool) -> None:
    """Approve SESSION's tool --run, bound to its exact arguments; it is dispatched once.

    Without --args-digest, the run's arguments and digest are shown (on stderr) and
    confirmed first; declined, nothing is dispatched and the command exits 1.
    """
    from baton.cli.common import note
    from baton.client import Client
    from baton.errors import not_found

    config = settings(log_level="warning")

    async def go() -> None:
        client = await Client.connect(config)
        try:
            full = await _full_run_id(client, session_id, run_id)
            chosen = digest
            if chosen is None:
                run_ = await client.store.runs.get(session_id, full)
                if run_ is None:
                    raise not_found(f"run {full} in session {session_id}",
                                    namespace=config.namespace, session_id=session_id)
                # The arguments are what is being approved: always shown, and on stderr,
                # where the question is, so stdout carries only the result.
                note(approval_prompt(full, run_.intent.tool, run_.intent.arguments,
                                     run_.intent.approval_digest, run_.status))
                if not yes and not confirmed("approve these arguments?"):
                    raise CliError("not approved; nothing was dispatched")
                chosen = run_.intent.approval_digest or ""
            seq = await client.approve(session_id, full, chosen)
            emit(as_json, {"run_id": full, "approved": True, "seq": seq},
                 f"approved {full} (commit {seq}): it is dispatched once")
        finally:
            await client.close()

    run(go())


@click.command("reject")
@click.argument("session_id", metavar="SESSION")
@click.option("--run", "run_id", required=True,
              help="the tool run to reject: its id, or the short form trace prints (2-0)")
@click.option("--reason", default="", help="what the model (or task) is told")
@json_option("the rejection")
def reject(session_id: str, run_id: str, reason: str, as_json: bool) -> None:
    """Reject SESSION's tool --run awaiting approval: it ends with error code 'rejected'."""
    from baton.client import Client

    config = settings(log_level="warning")

    async def go() -> None:
        client = await Client.connect(config)
        try:
            full = await _full_run_id(client, session_id, run_id)
            seq = await client.reject(session_id, full, reason)
            emit(as_json, {"run_id": full, "rejected": True, "seq": seq},
                 f"rejected {full} (commit {seq})")
            await _check_served(client, session_id, "the rejection is kept")  # told by a Brain
        finally:
            await client.close()

    run(go())
