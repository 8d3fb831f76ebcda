"""``baton dev``: run the local stack from a shell, in the foreground or detached.

Owns the command group: ``up`` starts a :class:`~baton.devkit.devstack.DevStack`, describes
it in ``dev.json`` and prints it (``--detach`` runs it in the background); ``down`` finds the
stack's processes again from ``dev.json`` (checking each PID still runs what it ran) and
stops them; ``status`` shows the processes and URLs (exit 1 when no stack runs); ``logs``
prints (``-f``: follows) a process's log (at the end of this module). The group itself
takes no options: ``baton dev`` alone shows its help.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from baton.cli.failures import CliError
from baton.devkit.devstack import DevStack
from baton.devkit.stack import home, overriding_variables, read_stack, stack_file
from baton.devkit.supervisor import keep_previous_log
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


def _show_stack(info: dict[str, Any], as_json: bool) -> None:
    """The stack for a person (a table, URLs, hints), or with ``--json`` the description
    ``dev status --json`` prints (the not-durable warning then goes to stderr)."""
    if not as_json:
        _print_stack(info)
        return
    click.echo(json.dumps({**info, "running": True}))
    if not info.get("durable", True):
        click.echo(f"warning: {NOT_DURABLE}", err=True)


def _print_stack(info: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    table = Table(title=f"baton dev ({info['base_dir']})", title_justify="left")
    status = any("alive" in p for p in info["processes"])
    for col in ("role", "name", "pid", *(["alive"] if status else []), "log"):
        table.add_column(col)
    logs_dir = Path(info["base_dir"]) / "logs"
    for p in info["processes"]:
        logf = logs_dir / f"{p['name']}.log" if p["role"] not in ("redis", "nats") else ""
        alive = (["yes" if p.get("alive") else "NO"] if status else [])
        name = f"{p['name']} {p['address']}" if p.get("address") else p["name"]
        table.add_row(p["role"], name, str(p["pid"]), *alive, str(logf))
    # The log paths are there to copy: the table takes the width they need rather than
    # the console's (80 columns when piped), which would fold them. A narrower terminal
    # wraps the long lines itself and copies them whole.
    wide = console.measure(table, options=console.options.update_width(1 << 16)).maximum
    Console(highlight=False, width=max(console.width, wide)).print(table)
    # The lines below carry URLs (one with a token), paths and a command to copy: never
    # wrapped by rich, which would break them at the console's width.
    line = functools.partial(console.print, soft_wrap=True)
    for key in ("redis_url", "nats_url", "mail_url", "api_url", "namespace"):
        if key in info:
            line(f"  {key:<10} {info[key]}")
    if "api_url" in info:  # the token in the fragment, which no server sees, for this user
        from baton.api.auth import dev_token

        token = dev_token(Path(info["base_dir"])) or ""
        line(f"  console    {info['api_url']}/console/#token={token} (API docs at "
             f"/docs; the API token is in {info.get('api_tokens_file', '')}, "
             "mode 0600)")
    if info.get("model"):
        line(f"  {'model':<10} {info['model']} (every agent)")
    if info.get("secure"):
        from baton.devkit.secure import CREDENTIALS, load_credentials, redacted

        found = load_credentials(Path(info["base_dir"])) or {}
        users = ", ".join(f"{u} {redacted(p)}" for u, p in sorted(found.items()))
        line(f"  users      {users}")
        line(f"  passwords  {Path(info['base_dir']) / CREDENTIALS} (mode 0600); "
             "commands run here connect as `client`, "
             "inspect, trace and watch as the read-only `operator`")
    if info.get("tls_ca"):
        line(f"  tls        Redis and NATS take TLS only; CA {info['tls_ca']} "
             "(BATON_REDIS_TLS_CA, BATON_NATS_TLS_CA)")
    line(f"  try: {_first_submit(info.get('app', ''))}")
    if not info.get("durable", True):
        console.print(f"[yellow]warning:[/yellow] {NOT_DURABLE}")


#: What ``baton dev`` without ``--durable`` says about its data.
NOT_DURABLE = (
    "not durable: Redis keeps its data in memory only, so a Redis restart (a crash, a kill, "
    "a reboot) loses every session. The loss is detected, not hidden: clients and workers "
    "then stop with a store epoch error. Use `baton dev up --durable` to keep sessions across "
    "restarts.")


def _first_submit(app_spec: str) -> str:
    """A first command to try against the stack's app (its first agent)."""
    if app_spec.endswith("examples.notices:app"):
        return 'baton submit --wait "Send the approved notice to ada@example.com"'
    if app_spec.endswith("examples.notice_batch:app"):  # its agent only hosts the task
        return ("baton start notice-batch --wait --input "
                '\'{"recipients": ["ada@example.com"], "subject": "Notice", "body": "Approved."}\'')
    try:
        from baton.app import load_app

        agent = next(iter(load_app(app_spec).agents.values()))
    except Exception:  # the hint is a courtesy: a broken app is reported by its workers
        return 'baton submit --wait --agent AGENT "..."'
    return f'baton submit --wait --agent {agent.name} --compat {agent.compat} "..."'



def _hands_for(app_spec: str, hands: int) -> int:
    """The Hands to start: none for an app that declares no tools and no MCP servers (a
    Hands with nothing to serve refuses to start, and the stack with it), said on stderr."""
    if not hands or app_spec.endswith(("examples.notices:app", "examples.notice_batch:app")):
        return hands
    try:
        from baton.app import load_app

        app = load_app(app_spec)
    except Exception:  # a broken app is reported by its workers, as before
        return hands
    if app.tools or app.mcp:  # MCP servers' tools are served by Hands too
        return hands
    click.echo(f"{app_spec} declares no tools: no Hands started (--hands {hands} ignored)",
               err=True)
    return 0


async def _serve_foreground(stack: DevStack, as_json: bool = False) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    path = stack_file({"BATON_HOME": str(stack.base_dir)})
    try:
        await stack.start()
        stack.write_stack_file()
        _show_stack(stack.describe(), as_json)
        _warn_of_overriding_variables(stack.describe())
        click.echo("running; Ctrl-C (or `baton dev down`) stops everything", err=as_json)
        watching = asyncio.ensure_future(_watch_servers(stack, stop))
        try:
            await stop.wait()
        finally:
            watching.cancel()
        click.echo("stopping: services drain, then the servers stop", err=as_json)
    finally:
        await stack.stop()
        info = read_stack({"BATON_HOME": str(stack.base_dir)})
        if info and info.get("supervisor_pid") == os.getpid():
            path.unlink(missing_ok=True)


#: How often the dev supervisor looks at its Redis and NATS servers.
SERVER_CHECK_S = 2.0


async def _watch_servers(stack: DevStack, stop: asyncio.Event) -> None:
    """A server of the stack that exits is said so on stderr (the stack's dev.log when
    detached), and started again on its port with its data where that is safe: NATS
    always (the relays create the streams again), Redis when the stack is durable (an
    empty Redis would be lost state: the workers stop with StoreEpochError). Single-server
    stacks only; a cluster's nodes fail over among themselves."""
    servers = stack.servers
    if servers is None:
        return
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SERVER_CHECK_S)
        for name, server, safe in (("nats", servers.nats, True),
                                   ("redis", servers.redis, stack.durable)):
            code = server.exit_code
            if code is None or stop.is_set():
                continue
            if not safe:
                click.echo(f"{name} exited (code {code}); this stack is not durable, so its "
                           "data is gone: `baton dev down`, then `baton dev up` (with "
                           "--durable a restart keeps the data)", err=True)
                server.kill()  # forget the process: said once
                continue
            click.echo(f"{name} exited (code {code}); starting it again on its port with "
                       "its data", err=True)
            try:
                await server.restart()
            except Exception as exc:  # said; the stack goes on without it
                click.echo(f"{name} did not start again: {exc}", err=True)
                continue
            stack.write_stack_file()  # its new pid
            click.echo(f"{name} is back (pid {server.pid})", err=True)


def _warn_of_overriding_variables(info: dict[str, Any]) -> None:
    """One line on stderr when this shell's BATON_REDIS_URL or BATON_NATS_URL (left from an
    earlier stack, say) name other servers: they would win over the stack just started."""
    if warning := overriding_variables(info):
        click.echo(warning, err=True)


def _stop_stack(base: Path, as_json: bool = False) -> None:
    env = {"BATON_HOME": str(base)}
    info = read_stack(env)
    if info is None:
        if as_json:
            click.echo(json.dumps({"stopped": False, "base_dir": str(base), "killed": []}))
        else:
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
    killed = []
    for p in leftovers:
        # Check the command line too: a PID may have been reused since dev.json was written.
        if _pid_alive(p.get("pid")) and _runs(p["pid"], _PROGRAM.get(p["role"], "baton")):
            click.echo(f"killing {p['name']} (pid {p['pid']})", err=as_json)
            killed.append(p["name"])
            with contextlib.suppress(ProcessLookupError):
                os.kill(p["pid"], signal.SIGKILL)
    stack_file(env).unlink(missing_ok=True)
    if as_json:  # killed: what did not stop on SIGTERM in time
        click.echo(json.dumps({"stopped": True, "base_dir": str(base), "killed": killed}))
    else:
        click.echo("stack stopped")


def _detach(base: Path, argv: list[str], as_json: bool = False) -> None:
    env = {"BATON_HOME": str(base)}
    (base / "logs").mkdir(parents=True, exist_ok=True)
    log_path = base / "logs" / "dev.log"
    keep_previous_log(log_path)
    with log_path.open("wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "baton", "dev", "up", *argv],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "BATON_HOME": str(base)}, start_new_session=True,
        )
    deadline = time.monotonic() + 90.0
    while True:
        info = read_stack(env)
        if info and info.get("supervisor_pid") == child.pid and info.get("ready"):
            _show_stack(info, as_json)
            _warn_of_overriding_variables(info)
            click.echo(f"detached (supervisor pid {child.pid}, log {log_path}); "
                       "stop with `baton dev down`", err=as_json)
            return
        if child.poll() is not None or time.monotonic() > deadline:
            if child.poll() is None:
                child.kill()
            raise CliError(start_failure(log_path.read_text(errors="replace")))
        time.sleep(0.05)


def start_failure(log: str, tail: int = 30) -> str:
    """What a detached start that failed says: the log's last ``error:`` line first (which
    worker, why), then the end of the log (that line may be further up than the tail)."""
    lines = log.splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    why = f": {errors[-1].removeprefix('error:').strip()}" if errors else ""
    return f"the stack did not start{why}\n" + "\n".join(lines[-tail:])


def _up_options(f: Any) -> Any:
    for option in reversed([
        click.option("--brains", default=1, show_default=True, type=click.IntRange(0, 64),
                     help="Brain workers"),
        click.option("--hands", default=2, show_default=True, type=click.IntRange(0, 64),
                     help="Hands workers"),
        click.option("--relays", default=1, show_default=True, type=click.IntRange(0, 64),
                     help="outbox relays"),
        click.option("--mail-delay-ms", default=0, show_default=True,
                     type=click.IntRange(0, 60_000),
                     help="hold each new mail this long before the mail service answers"),
        click.option("--durable", is_flag=True,
                     help="AOF fsync always, JetStream sync always; keep data (without it a "
                          "Redis restart loses every session)"),
        click.option("--secure", is_flag=True,
                     help="per-stack generated credentials and TLS: every service connects "
                          "as its role's Redis ACL and NATS user, over TLS with the stack's CA"),
        click.option("--cluster", is_flag=True,
                     help="a Redis Cluster (3 primaries, 2 replicas each: one lost node "
                          "stops no shard) and 3 NATS nodes"),
        click.option("--detach", is_flag=True, help="run the stack in the background and return"),
        click.option("--app", "app_spec", default="baton.examples.notices:app",
                     show_default=True,
                     help="module:attribute of the App every Brain and Hands runs"),
        click.option("--model", "model", default="", metavar="PROVIDER:NAME",
                     help="run every agent on this model (openai:gpt-4o-mini, "
                          "anthropic:claude-sonnet-4-5, openai-compatible:llama3.1); keys and "
                          "base URLs from the environment"),
        click.option("--api/--no-api", "api", default=True, show_default=True,
                     help="serve the HTTP API and web console (on loopback, with its own token)"),
        click.option("--json", "as_json", is_flag=True,
                     help="one JSON object: the stack's description (as `dev status --json`)"),
    ]):
        f = option(f)
    return f


@click.group("dev")
def dev_command() -> None:
    """Run Redis, NATS, the mail service, brains, hands and relays as local processes.

    The stack lives in $BATON_HOME (default ./.baton); `baton submit` finds it via dev.json.
    """


@dev_command.command("up")
@_up_options
def up_command(brains: int, hands: int, relays: int, mail_delay_ms: int, durable: bool,
               secure: bool, cluster: bool, detach: bool, app_spec: str, model: str,
               api: bool, as_json: bool) -> None:
    """Start the stack (in the foreground until Ctrl-C, or --detach)."""
    _up(brains, hands, relays, mail_delay_ms, durable, cluster, detach, app_spec, model, api,
        secure, as_json)


@dev_command.command("down")
@click.option("--json", "as_json", is_flag=True,
              help="one JSON object: stopped, and what had to be killed")
def down_command(as_json: bool) -> None:
    """Stop the stack described in dev.json (services drain first)."""
    _stop_stack(home(), as_json)


@dev_command.command("status")
@click.option("--json", "as_json", is_flag=True, help="one JSON object: the stack's description")
@click.option("--env", "as_env", is_flag=True,
              help="the client's BATON_* variables (and a secure stack's operator's, "
                   "BATON_OPERATOR_*, for inspect, trace and watch) as shell exports, for "
                   'Settings.from_env(): eval "$(baton dev status --env)"')
def status_command(as_json: bool, as_env: bool) -> None:
    """The stack's processes and URLs; exit 1 when no stack runs."""
    base = home()
    info = read_stack({"BATON_HOME": str(base)})
    running = bool(info) and _pid_alive(int((info or {}).get("supervisor_pid") or 0))
    if not info or not running:
        from baton.cli.failures import CliError

        if as_json:
            click.echo(json.dumps({"running": False, "base_dir": str(base)}))
        raise CliError(f"no stack running in {base}"
                       + (" (dev.json is left from a stack that died; `baton dev down` "
                          "cleans up)" if info else "; start one with `baton dev up`"))
    if as_env:  # what a library user's Settings.from_env() needs to reach this stack
        import shlex

        from baton.devkit.stack import OPERATOR_ENV, settings_from_env_or_stack

        exports = settings_from_env_or_stack("client").to_env()
        # and the operator's credential where it differs (a secure stack): with only the
        # client's exported, inspect, trace and watch would read as the client
        operator = settings_from_env_or_stack("operator").to_env()
        for x in OPERATOR_ENV:
            if operator.get(f"BATON_{x}") and operator[f"BATON_{x}"] != exports.get(f"BATON_{x}"):
                exports[f"BATON_OPERATOR_{x}"] = operator[f"BATON_{x}"]
        for key, value in sorted(exports.items()):
            click.echo(f"export {key}={shlex.quote(value)}")
        return
    procs = [{**p, "alive": _pid_alive(p.get("pid"))} for p in info.get("processes", [])]
    view = {**info, "running": True, "processes": procs}
    if as_json:
        click.echo(json.dumps(view))
        return
    _print_stack(view)


def _check_model(model: str) -> None:
    """Fail before anything starts when the model's provider, key or base URL is missing."""
    from baton.brain.model import model_client
    from baton.errors import ConfigError
    from baton.settings import Settings

    try:
        model_client(model, Settings.from_env())
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def _up(brains: int, hands: int, relays: int, mail_delay_ms: int, durable: bool, cluster: bool,
        detach: bool, app_spec: str, model: str = "", api: bool = True,
        secure: bool = False, as_json: bool = False) -> None:
    from baton.observability import log as logs

    if model:
        _check_model(model)
    hands = _hands_for(app_spec, hands)
    base = home()
    running = read_stack({"BATON_HOME": str(base)})
    if running and _pid_alive(running.get("supervisor_pid")):
        raise CliError(
            f"a stack is running already (supervisor pid {running['supervisor_pid']}); "
            "stop it with `baton dev down`")
    if detach:
        _detach(base, ["--brains", str(brains), "--hands", str(hands), "--relays", str(relays),
                       "--mail-delay-ms", str(mail_delay_ms), "--app", app_spec,
                       *(["--model", model] if model else []),
                       *(["--durable"] if durable else []), *(["--cluster"] if cluster else []),
                       *(["--secure"] if secure else []),
                       "--api" if api else "--no-api"], as_json)
        return
    logs.configure(os.environ.get("BATON_LOG_LEVEL", "info"))
    stack = DevStack(base, brains=brains, hands=hands, relays=relays,
                     mail_delay_ms=mail_delay_ms, durable=durable, app_spec=app_spec,
                     cluster=cluster, secure=secure,
                     namespace=os.environ.get("BATON_NAMESPACE") or "baton",
                     env={"BATON_AGENT_MODEL": model} if model else None, api=api)
    try:
        asyncio.run(_serve_foreground(stack, as_json))
    except ServerError as exc:
        raise CliError(str(exc)) from None


# ------------------------------------------------------------------ baton dev logs


@dev_command.command("logs")
@click.argument("name", required=False)
@click.option("-f", "--follow", is_flag=True, help="keep printing what is appended")
@click.option("-n", "--lines", default=0, type=click.IntRange(0),
              help="only the last N lines (default: all)")
@click.option("--json", "as_json", is_flag=True,
              help="JSON Lines: without NAME, the list as one object; a log's lines each "
                   "as an object (the services' lines are JSON already; others become "
                   "{\"line\": ...})")
def logs_command(name: str | None, follow: bool, lines: int, as_json: bool) -> None:
    """Print the log of process NAME (brain-1, hands-2, relay-1, mailbox, redis, nats, dev).

    Without NAME, list the logs there are.
    """
    base = home()
    found = _log_files(base)
    if name is None:
        if not found:
            raise CliError(f"no logs in {base}; start a stack with `baton dev up`")
        if as_json:
            click.echo(json.dumps({key: str(found[key]) for key in sorted(found)}))
            return
        for key in sorted(found):
            click.echo(f"{key:<12} {found[key]}")
        return
    path = found.get(name)
    if path is None:
        raise CliError(f"no log of {name!r} in {base}; there are: "
                       f"{', '.join(sorted(found)) or 'none'}")
    _print_log(path, follow, lines, as_json)


def _log_files(base: Path) -> dict[str, Path]:
    """Process name -> log file: services under logs/, the servers in their data dirs."""
    found: dict[str, Path] = {}
    if base.exists():
        for path in sorted(base.rglob("*.log")):
            found.setdefault(path.stem, path)
    return found


def _print_log(path: Path, follow: bool, lines: int, as_json: bool = False) -> None:
    with path.open("rb") as src:
        text = src.read().decode(errors="replace")
        if lines:
            text = "".join(text.splitlines(keepends=True)[-lines:])
        pending = _echo_log(text, as_json)
        if pending and not follow:  # a last line without its newline (yet)
            _echo_log(pending + "\n", as_json)
        while follow:  # like tail -f: until Ctrl-C
            chunk = src.read()
            if chunk:
                pending = _echo_log(pending + chunk.decode(errors="replace"), as_json)
            else:
                time.sleep(0.2)


def _echo_log(text: str, as_json: bool) -> str:
    """Print ``text``; with ``as_json`` only its whole lines, returning the unfinished one."""
    if not as_json:
        click.echo(text, nl=False)
        return ""
    whole, _, rest = text.rpartition("\n")
    if whole or text.endswith("\n"):
        click.echo(_as_json_lines(whole), nl=False)
    return rest


def _as_json_lines(text: str) -> str:
    """Each line as a JSON object: a service's line as it is, any other one wrapped."""
    out = []
    for line in text.splitlines():
        try:
            is_object = isinstance(json.loads(line), dict)
        except ValueError:
            is_object = False
        out.append(line if is_object else json.dumps({"line": line}))
    return "".join(f"{line}\n" for line in out)
