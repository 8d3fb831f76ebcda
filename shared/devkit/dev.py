"""``baton dev``: run the local stack from a shell, in the foreground or detached.

Owns the command: starting a :class:`~baton.devkit.devstack.DevStack` and describing it in
``dev.json``, printing it, detaching it into the background, and ``--stop``, which finds the
stack's processes again from ``dev.json`` (checking each PID still runs what it ran).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from baton.devkit.devstack import DevStack
from baton.devkit.stack import home, read_stack, stack_file
from baton.errors import ServerError

__all__ = ["dev_command"]


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")  # a zombie is dead for our purposes
    with contextlib.suppress(OSError):
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


_PROGRAM = {"redis": "redis-server", "nats": "nats-server"}


def _runs(pid: int, program: str) -> bool:
    """Whether ``pid`` runs ``program`` (true where /proc cannot tell)."""
    try:
        return program.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return not Path("/proc/self").exists()


def _print_stack(info: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"baton dev ({info['base_dir']})", title_justify="left")
    for col in ("role", "name", "pid", "log"):
        table.add_column(col)
    logs_dir = Path(info["base_dir"]) / "logs"
    for p in info["processes"]:
        logf = logs_dir / f"{p['name']}.log" if p["role"] not in ("redis", "nats") else ""
        table.add_row(p["role"], p["name"], str(p["pid"]), str(logf))
    console.print(table)
    for key in ("redis_url", "nats_url", "mail_url", "namespace"):
        console.print(f"  {key:<10} {info[key]}")
    console.print('  try: baton submit --wait "Send the approved notice to ada@example.com"')


async def _serve_foreground(stack: DevStack) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    path = stack_file({"BATON_HOME": str(stack.base_dir)})
    try:
        await stack.start()
        stack.write_stack_file()
        _print_stack(stack.describe())
        click.echo("running; Ctrl-C (or `baton dev --stop`) stops everything")
        await stop.wait()
        click.echo("stopping: services drain, then the servers stop")
    finally:
        await stack.stop()
        info = read_stack({"BATON_HOME": str(stack.base_dir)})
        if info and info.get("supervisor_pid") == os.getpid():
            path.unlink(missing_ok=True)


def _stop_stack(base: Path) -> None:
    env = {"BATON_HOME": str(base)}
    info = read_stack(env)
    if info is None:
        click.echo(f"no stack described in {stack_file(env)}")
        return
    sup = int(info.get("supervisor_pid") or 0)
    if _pid_alive(sup) and _runs(sup, "baton"):
        os.kill(sup, signal.SIGTERM)
        deadline = time.monotonic() + 30.0
        while _pid_alive(sup) and time.monotonic() < deadline:
            time.sleep(0.05)
    leftovers = [{"pid": sup, "name": "supervisor", "role": "supervisor"},
                 *info.get("processes", [])]
    for p in leftovers:
        # Check the command line too: a PID may have been reused since dev.json was written.
        if _pid_alive(p.get("pid")) and _runs(p["pid"], _PROGRAM.get(p["role"], "baton")):
            click.echo(f"killing {p['name']} (pid {p['pid']})")
            with contextlib.suppress(ProcessLookupError):
                os.kill(p["pid"], signal.SIGKILL)
    stack_file(env).unlink(missing_ok=True)
    click.echo("stack stopped")


def _detach(base: Path, argv: list[str]) -> None:
    env = {"BATON_HOME": str(base)}
    (base / "logs").mkdir(parents=True, exist_ok=True)
    log_path = base / "logs" / "dev.log"
    with log_path.open("wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "baton", "dev", *argv],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "BATON_HOME": str(base)}, start_new_session=True,
        )
    deadline = time.monotonic() + 90.0
    while True:
        info = read_stack(env)
        if info and info.get("supervisor_pid") == child.pid and info.get("ready"):
            _print_stack(info)
            click.echo(f"detached (supervisor pid {child.pid}, log {log_path}); "
                       "stop with `baton dev --stop`")
            return
        if child.poll() is not None or time.monotonic() > deadline:
            if child.poll() is None:
                child.kill()
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
            raise click.ClickException(f"the stack did not start:\n{tail}")
        time.sleep(0.05)


@click.command("dev")
@click.option("--brains", default=1, show_default=True, type=click.IntRange(0, 64))
@click.option("--hands", default=2, show_default=True, type=click.IntRange(0, 64))
@click.option("--relays", default=1, show_default=True, type=click.IntRange(0, 64))
@click.option("--mail-delay-ms", default=0, show_default=True, type=click.IntRange(0, 60_000),
              help="hold each new mail this long before the mail service answers")
@click.option("--durable", is_flag=True, help="AOF fsync always, JetStream sync always; keep data")
@click.option("--cluster", is_flag=True, help="a 3+3 Redis Cluster and 3 NATS nodes")
@click.option("--detach", is_flag=True, help="run the stack in the background and return")
@click.option("--app", "app_spec", default="baton.examples.notices:app", show_default=True)
@click.option("--stop", "stop_", is_flag=True, help="stop the stack described in dev.json")
def dev_command(brains: int, hands: int, relays: int, mail_delay_ms: int, durable: bool,
                cluster: bool, detach: bool, app_spec: str, stop_: bool) -> None:
    """Run Redis, NATS, the mail service, brains, hands and relays as local processes.

    The stack lives in $BATON_HOME (default ./.baton); `baton submit` finds it via dev.json.
    """
    from baton.observability import log as logs

    base = home()
    if stop_:
        _stop_stack(base)
        return
    running = read_stack({"BATON_HOME": str(base)})
    if running and _pid_alive(running.get("supervisor_pid")):
        raise click.ClickException(
            f"a stack is running already (supervisor pid {running['supervisor_pid']}); "
            "stop it with `baton dev --stop`")
    if detach:
        _detach(base, ["--brains", str(brains), "--hands", str(hands), "--relays", str(relays),
                       "--mail-delay-ms", str(mail_delay_ms), "--app", app_spec,
                       *(["--durable"] if durable else []), *(["--cluster"] if cluster else [])])
        return
    logs.configure(os.environ.get("BATON_LOG_LEVEL", "info"))
    stack = DevStack(base, brains=brains, hands=hands, relays=relays,
                     mail_delay_ms=mail_delay_ms, durable=durable, app_spec=app_spec,
                     cluster=cluster, namespace=os.environ.get("BATON_NAMESPACE") or "baton")
    try:
        asyncio.run(_serve_foreground(stack))
    except ServerError as exc:
        raise click.ClickException(str(exc)) from None
