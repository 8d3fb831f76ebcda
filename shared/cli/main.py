"""The ``baton`` command line: services, the dev stack, and client commands."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any

import click

from baton.cli.observe import inspect_command, trace_command, watch_command
from baton.devkit.demo import demo_command
from baton.devkit.dev import dev_command
from baton.devkit.mailbox import mailbox_command
from baton.devkit.stack import settings_from_env_or_stack
from baton.errors import BatonError
from baton.observability import log as logs
from baton.observability import telemetry
from baton.settings import Settings


def _settings(role: str = "", **overrides: Any) -> Settings:
    """Settings and logging; with ``role``, OpenTelemetry from the ``OTEL_*`` variables too
    (nothing when none is set; flushed by :func:`_run`)."""
    try:
        settings = settings_from_env_or_stack(**overrides)
    except BatonError as exc:
        raise click.ClickException(str(exc)) from None
    logs.configure(settings.log_level, settings.log_format)
    if role:
        telemetry.setup(role, settings)
    return settings


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        return asyncio.run(coro)
    except BatonError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        telemetry.shutdown()  # spans still batched go out now


@click.group()
@click.version_option(package_name="baton")
def main() -> None:
    """Baton: durable Brain/Hands agents over NATS JetStream and Redis."""


@main.command()
@click.option("--app", "app_spec", required=True, help="module:attribute of the App")
@click.option("--name", default=None, help="worker name (default: brain-<host>-<pid>)")
def brain(app_spec: str, name: str | None) -> None:
    """Run a Brain worker: consumes wakes, runs sessions' tasks under leases."""
    from baton.brain.worker import main as brain_main

    _run(brain_main(_settings("brain", worker_name=name), app_spec))


@main.command()
@click.option("--app", "app_spec", required=True, help="module:attribute of the App")
@click.option("--tools", default=None, help="comma-separated tools to serve (default: all)")
@click.option("--name", default=None, help="worker name (default: hands-<host>-<pid>)")
def hands(app_spec: str, tools: str | None, name: str | None) -> None:
    """Run a Hands worker: executes tool runs under attempt fences."""
    from baton.hands.worker import main as hands_main

    served = [t.strip() for t in tools.split(",") if t.strip()] if tools else None
    _run(hands_main(_settings("hands", worker_name=name), app_spec, served))


@main.command()
@click.option("--name", default=None, help="worker name (default: relay-<host>-<pid>)")
def relay(name: str | None) -> None:
    """Run an outbox relay: publishes committed outbox rows, fires timers."""
    from baton.relay.worker import main as relay_main

    _run(relay_main(_settings("relay", worker_name=name)))


@main.command()
@click.option("--agent", default="notices", show_default=True)
@click.option("--compat", default=1, show_default=True)
@click.option("--session", "session_id", default=None, help="session id (default: new)")
@click.option("--request-id", default=None, help="idempotency key of this input")
@click.option("--wait/--no-wait", default=False, help="wait for the final answer")
@click.option("--timeout", default=60.0, show_default=True)
@click.argument("text")
def submit(agent: str, compat: int, session_id: str | None, request_id: str | None,
           wait: bool, timeout: float, text: str) -> None:
    """Submit TEXT to a session; the same --request-id never creates a second submission."""
    from baton.client import Client

    settings = _settings("client")

    async def go() -> None:
        client = await Client.connect(settings)
        try:
            sub, created = await client.submit(text, agent=agent, compat=compat,
                                               session_id=session_id, request_id=request_id)
            click.echo(sub.model_dump_json() if created else
                       sub.model_copy(update={}).model_dump_json())
            if not created:
                click.echo("(request id seen before: this is the original submission)", err=True)
            if wait:
                final = await client.wait(sub, timeout)
                click.echo(final.model_dump_json())
                if final.status != "completed":
                    sys.exit(1)
        finally:
            await client.close()

    _run(go())


main.add_command(mailbox_command)
main.add_command(dev_command)
main.add_command(demo_command)
main.add_command(trace_command)
main.add_command(watch_command)
main.add_command(inspect_command)


@main.command("start")
@click.argument("kind")
@click.option("--input", "input_json", default="{}", show_default=True,
              help="the task's input, a JSON object")
@click.option("--session", "session_id", default=None, help="session id (default: new)")
@click.option("--agent", default=None, help="the session's agent (default: KIND)")
@click.option("--compat", default=1, show_default=True)
@click.option("--request-id", default=None, help="idempotency key of this start")
@click.option("--wait/--no-wait", default=False, help="wait until the task has ended")
@click.option("--timeout", default=60.0, show_default=True)
def start(kind: str, input_json: str, session_id: str | None, agent: str | None, compat: int,
          request_id: str | None, wait: bool, timeout: float) -> None:
    """Start a root task of KIND (a custom task the app registers) in a session."""
    import json

    from baton.client import Client

    try:
        task_input = json.loads(input_json)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--input") from None
    if not isinstance(task_input, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--input")
    settings = _settings("client")

    async def go() -> None:
        client = await Client.connect(settings)
        try:
            sid, task_id, created = await client.start_task(
                session_id, kind, task_input, agent=agent or kind, compat=compat,
                request_id=request_id)
            click.echo(json.dumps({"session_id": sid, "task_id": task_id, "created": created}))
            if wait:
                task = await client.wait_task(sid, task_id, timeout)
                click.echo(task.model_dump_json())
                if task.state.name != "terminal" or task.state.outcome != "completed":
                    sys.exit(1)
        finally:
            await client.close()

    _run(go())


from baton.observability.health import health_command  # noqa: E402  (production checks)

main.add_command(health_command)


# Fault injection and benchmarks: `baton chaos`, `baton bench`.
from baton.devkit.chaos import chaos_command  # noqa: E402

main.add_command(chaos_command)


@main.command("bench", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args: tuple[str, ...]) -> None:
    """Benchmarks side by side: chain, tool round trip, sessions/s, takeover, step cost.

    Runs `python -m bench [all | NAME ...] [--quick]` in the source checkout (the benchmarks
    ship with the sources): a table per benchmark, every figure beside its target, JSON and
    an SVG picture in bench/results/.
    """
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if not (root / "bench" / "__main__.py").exists():
        raise click.ClickException("the benchmarks ship with the source tree: run "
                                   "`baton bench` from a checkout (make bench)")
    sys.exit(subprocess.call([sys.executable, "-m", "bench", *(args or ("all",))], cwd=root))


# Operator decisions: `baton cancel`, `baton approve`, `baton reject` (baton.store.control).
@main.command("cancel")
@click.argument("session_id")
@click.option("--task", "task_id", default=None, help="cancel this task (default: the session)")
@click.option("--reason", default="", help="recorded in the cancel receipt")
@click.option("--wait/--no-wait", default=False, help="wait until the cancelled work has ended")
@click.option("--timeout", default=60.0, show_default=True)
def cancel(session_id: str, task_id: str | None, reason: str, wait: bool,
           timeout: float) -> None:
    """Cancel SESSION's tasks (or one --task): committed first, then carried out by a Brain.

    Idempotent: a repeated cancel answers "pending"; one of finished work "finished".
    """
    import json

    from baton.client import Client

    settings = _settings()

    async def go() -> None:
        client = await Client.connect(settings)
        try:
            answer = await client.cancel(session_id, task_id, reason=reason)
            click.echo(json.dumps(answer.to_dict()))
            if wait and answer.status != "finished":
                ended = await client.wait_cancelled(session_id, task_id, timeout)
                click.echo(json.dumps({"ended": ended}))
        finally:
            await client.close()

    _run(go())


@main.command("approve")
@click.argument("run_id")
@click.option("--session", "session_id", required=True, help="the run's session")
@click.option("--args-digest", "digest", default=None,
              help="the digest of the arguments you approve (shown by inspect)")
@click.option("--yes", is_flag=True, help="approve the shown arguments without asking")
def approve(run_id: str, session_id: str, digest: str | None, yes: bool) -> None:
    """Approve RUN, bound to its exact arguments; it is dispatched once.

    Without --args-digest, the run's arguments and digest are shown and confirmed first.
    """
    import json

    from baton.client import Client
    from baton.errors import NotFoundError

    settings = _settings()

    async def go() -> None:
        client = await Client.connect(settings)
        try:
            chosen = digest
            if chosen is None:
                run = await client.store.run(session_id, run_id)
                if run is None:
                    raise NotFoundError(f"no run {run_id} in session {session_id}")
                click.echo(json.dumps({"run_id": run_id, "tool": run.intent.tool,
                                       "arguments": run.intent.arguments,
                                       "digest": run.intent.approval_digest,
                                       "status": run.status}, indent=2))
                if not yes and not click.confirm("approve these arguments?"):
                    raise click.Abort()
                chosen = run.intent.approval_digest or ""
            seq = await client.approve(session_id, run_id, chosen)
            click.echo(json.dumps({"run_id": run_id, "approved": True, "seq": seq}))
        finally:
            await client.close()

    _run(go())


@main.command("reject")
@click.argument("run_id")
@click.option("--session", "session_id", required=True, help="the run's session")
@click.option("--reason", default="", help="what the model (or task) is told")
def reject(run_id: str, session_id: str, reason: str) -> None:
    """Reject RUN awaiting approval: it ends with error code 'rejected'."""
    import json

    from baton.client import Client

    settings = _settings()

    async def go() -> None:
        client = await Client.connect(settings)
        try:
            seq = await client.reject(session_id, run_id, reason)
            click.echo(json.dumps({"run_id": run_id, "rejected": True, "seq": seq}))
        finally:
            await client.close()

    _run(go())


if __name__ == "__main__":
    main()
