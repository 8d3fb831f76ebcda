"""``baton dev logs``: the logs of the local stack's processes.

Each process of a stack started by ``baton dev`` writes its log under the stack's home: the
services under ``logs/``, Redis and NATS in their data directories. ``logs NAME`` prints one
(``-f`` follows it, ``-n`` only its last lines, ``--json`` each line as a JSON object: the
services' lines are JSON already); without NAME, the logs there are.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from baton.cli.failures import CliError
from baton.devkit.stack import home

__all__ = ["logs_command"]


@click.command("logs")
@click.argument("name", required=False)
@click.option("-f", "--follow", is_flag=True, help="keep printing what is appended")
@click.option("-n", "--lines", default=0, type=click.IntRange(0),
              help="only the last N lines (default: all)")
@click.option("--json", "as_json", is_flag=True,
              help="JSON lines: the list as one object, a log's lines each as an object "
                   "(the services' lines are JSON already; others become {\"line\": ...})")
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
