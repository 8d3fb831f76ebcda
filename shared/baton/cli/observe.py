"""The read-only commands: ``baton trace``, ``baton watch`` and ``baton inspect``.

They find the stack like every client command (``BATON_*``, else ``.baton/dev.json``), never
take a lease and never write, and connect as the read-only ``operator`` user where one is
configured (``BATON_OPERATOR_*``, or a secure dev stack's), else as the client. A session
archived after its retention is read from the archive (``BATON_ARCHIVE_URL``; see
:mod:`baton.store.archived`) and shown as it was, marked archived. ``trace`` can also read
receipts saved to a file: ``baton demo`` saves its session's receipts under
``$BATON_HOME/traces/``, so the demo's trace can be shown again after its private stack is
gone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from baton.cli.common import json_option, resolve_run, settings
from baton.cli.common import run as _run
from baton.cli.failures import CliError
from baton.cli.trace import build_trace, render_text
from baton.cli.trace.html import render_html
from baton.devkit.stack import home
from baton.errors import BatonError, ValidationError
from baton.receipts import Receipt
from baton.settings import Settings
from baton.store.redis_client import redis_user
from baton.store.state import receipts_about, run_ids_of
from baton.store.store import Store

__all__ = [
    "inspect_command", "load_receipts", "save_receipts", "saved_receipts_path", "trace_command",
    "watch_command",
]


def saved_receipts_path(session_id: str, base: Path | None = None) -> Path:
    return (base or home()) / "traces" / f"{session_id}.json"


def save_receipts(session_id: str, receipts: list[Receipt], base: Path | None = None) -> Path:
    path = saved_receipts_path(session_id, base)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"session_id": session_id,
                                "receipts": [r.model_dump(mode="json") for r in receipts]}))
    return path


def load_receipts(path: Path) -> tuple[str, list[Receipt]]:
    """Receipts saved by :func:`save_receipts`; a file that is not such a save is a
    one-line :class:`~baton.errors.ValidationError` naming it."""
    from pydantic import ValidationError as PydanticValidationError

    try:
        data = json.loads(path.read_text())
        return str(data["session_id"]), [Receipt.model_validate(r) for r in data["receipts"]]
    except ValueError as exc:  # JSON, and pydantic's own error, are ValueErrors
        first = (f"{'.'.join(map(str, exc.errors()[0]['loc']))}: {exc.errors()[0]['msg']}"
                 if isinstance(exc, PydanticValidationError) and exc.errors() else exc)
        problem = str(first).splitlines()[0] if str(first) else type(exc).__name__
    except (KeyError, TypeError) as exc:
        problem = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
    raise ValidationError(f"{path} is not a file of receipts saved by baton ({problem})")


def _settings() -> Settings:
    return settings(log_level="warning", user="operator")


async def _live_receipts(settings: Settings, session_id: str, task_id: str | None,
                         ) -> tuple[list[Receipt], dict[str, Any] | None, int | None]:
    """The session's receipts, its quarantine record when it is quarantined, and when it
    was archived when its receipts were read from the archive."""
    from baton.store.archived import ArchivedReads, SessionSource
    from baton.store.quarantine import quarantine_of

    store = await Store.connect(settings)
    archived = ArchivedReads(store)
    try:
        sk = store.keys.session(session_id)
        source = SessionSource(store)
        if not await store.redis.exists(sk.meta, *(key for _, key in sk.receipt_streams())):
            source = await archived.require(session_id)
        record = await quarantine_of(source.store, session_id)
        quarantine = None if record is None else {
            "tries": record.get("tries"), "reason": record.get("quarantine_reason", ""),
            "quarantined_ms": record.get("quarantined")}
        receipts = await source.store.receipts_for(session_id, task_id=task_id)
        return receipts, quarantine, source.marker()["archived_ms"]
    finally:
        await archived.close()
        await store.close()


@click.command("trace")
@click.argument("session_id", metavar="SESSION")
@json_option("the timeline")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, path_type=Path),
              help="write a self-contained picture (a lane per process) to this file and "
              "print only where it is (with --json, the timeline still)")
@click.option("--task", "task_id", default=None, help="only receipts about this task")
@click.option("--run", "run_id", default=None,
              help="only receipts about this tool run: its id, or the short form shown (2-0)")
@click.option("--receipts", "receipts_file", default=None,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="read receipts saved by `baton demo` instead of Redis")
def trace_command(session_id: str, as_json: bool, html_file: Path | None, task_id: str | None,
                  run_id: str | None, receipts_file: Path | None) -> None:
    """The handoff timeline of SESSION from its receipts: who did what, with which fence."""
    saved = receipts_file or saved_receipts_path(session_id)
    quarantine: dict[str, Any] | None = None
    archived_ms: int | None = None
    if receipts_file is None:
        try:
            receipts, quarantine, archived_ms = _run(_live_receipts(
                _settings(), session_id, task_id))
        except click.ClickException as exc:
            if not saved.exists():
                raise
            click.echo(f"({exc.message}; showing the receipts saved at {saved})", err=True)
            receipts_file = saved
    if receipts_file is not None:
        _, receipts = load_receipts(receipts_file)
        receipts = receipts_about(receipts, task_id=task_id)
    if run_id is not None:  # the timeline shows runs short: take those forms too
        run_id = resolve_run(run_id, run_ids_of(receipts))
        receipts = receipts_about(receipts, run_id=run_id)
    if not receipts and (task_id or run_id):  # the session has receipts (checked above)
        what = " and ".join(f"{k} {v}" for k, v in (("task", task_id), ("run", run_id)) if v)
        raise CliError(f"no receipts about {what} in session {session_id}: is the id right? "
                       f"(`baton inspect {session_id}` lists its tasks and runs)")
    trace = build_trace(session_id, receipts, quarantine, archived_ms=archived_ms)
    if html_file is not None:
        html_file.write_text(render_html(trace))
    if as_json:  # one JSON document on one line, as every other command's --json
        click.echo(json.dumps(trace.to_json(), default=str))
        if html_file is not None:
            click.echo(f"wrote {html_file}", err=True)
    elif html_file is not None:  # the page is the result: the text would bury where it is
        click.echo(f"wrote {html_file}")
    else:
        click.echo(render_text(trace), nl=False)


@click.command("watch")
@click.argument("session_id", metavar="SESSION")
@json_option("the snapshot, then one object per change", lines=True)
@click.option("--from", "after", default=None, help="resume after this receipt id (no snapshot)")
@click.option("--until-settled", is_flag=True, help="exit once every submission is settled")
@click.option("--connect-wait", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="before the first read, retry an unreachable Redis this long (default 5)")
def watch_command(session_id: str, as_json: bool, after: str | None, until_settled: bool,
                  connect_wait: float | None) -> None:
    """A snapshot of SESSION, then its changes live (read-only; survives reconnects)."""
    from baton.cli.watch import FIRST_GIVE_UP_S, Watch, emitter

    watch = Watch(_settings(), session_id, emitter(as_json), after=after,
                  until_settled=until_settled,
                  first_give_up_s=FIRST_GIVE_UP_S if connect_wait is None else connect_wait)
    last = _run(watch.run())
    click.echo(f"(last receipt {last}; resume with --from {last})", err=True)


@click.command("inspect")
@click.argument("session_id", metavar="[SESSION]", required=False)
@json_option("the session's view, or the cluster's")
def inspect_command(session_id: str | None, as_json: bool) -> None:
    """Tasks, tool runs, lease and backlog of SESSION; without one, the cluster view."""
    from baton.bus.bus import Bus
    from baton.cli.inspect import cluster_view, render_cluster, render_session, session_view
    from baton.store.archived import ArchivedReads

    settings = _settings()

    async def go() -> dict[str, Any]:
        store = await Store.connect(settings)
        bus: Bus | None = None
        archived = ArchivedReads(store)
        try:
            if session_id:
                return await archived.read(session_id, lambda source: session_view(
                    store, session_id, source=source))
            if redis_user(settings) == "client":  # a client's NATS user may do nothing
                view = await cluster_view(store, None)
                view["subjects"]["error"] = (
                    "a client's credential has no NATS access: set BATON_OPERATOR_NATS_USER "
                    "and _PASSWORD (the operator's) to see the JetStream subjects")
                return view
            try:  # the JetStream part of the view; the rest stands without it
                bus = await Bus.connect(settings, "inspect", "operator")
            except BatonError as exc:
                click.echo(f"(NATS: {exc}; JetStream subjects not shown)", err=True)
            return await cluster_view(store, bus)
        finally:
            if bus is not None:
                await bus.close()
            await archived.close()
            await store.close()

    view = _run(go())
    if as_json:
        click.echo(json.dumps(view, default=str))
        return
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    (render_session if session_id else render_cluster)(view, console)
