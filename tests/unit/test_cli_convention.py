"""The CLI convention of docs/cli.md, checked on every command of the registry: a command
added later that breaks it fails here, named."""

from __future__ import annotations

from collections.abc import Iterator

import click

from baton.cli.common import JSON_LINES, JSON_OBJECT
from baton.cli.main import COMMANDS, SECTIONS, main

#: The sections of ``baton --help`` (docs/cli.md), in order.
GROUPS = ("Services", "Sessions", "Operate", "Develop")
#: The nouns every command spells the same way: parameter name -> its one spelling.
NOUNS = {"task_id": "--task", "run_id": "--run"}


def _commands() -> Iterator[tuple[str, click.Command]]:
    ctx = click.Context(main)

    def walk(path: str, command: click.Command) -> Iterator[tuple[str, click.Command]]:
        yield path, command
        if isinstance(command, click.Group):
            for sub in command.list_commands(ctx):
                subcommand = command.get_command(ctx, sub)
                assert subcommand is not None, f"{path} {sub}"
                yield from walk(f"{path} {sub}", subcommand)

    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        assert command is not None, name
        yield from walk(name, command)


def _options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option)]


def _arguments(command: click.Command) -> list[click.Argument]:
    return [p for p in command.params if isinstance(p, click.Argument)]


def test_every_command_is_in_one_section_of_help_in_order() -> None:
    assert tuple(title.split()[0] for title in SECTIONS) == GROUPS
    listed = [name for names in SECTIONS.values() for name in names]
    assert len(listed) == len(set(listed)) and set(listed) == set(COMMANDS)
    shown = main.get_help(click.Context(main, info_name="baton"))
    at = [shown.index(f"\n{title}:\n") for title in SECTIONS]
    assert at == sorted(at), shown
    assert "\nCommands:\n" not in shown  # nothing left outside the sections


def test_every_option_has_help_and_every_argument_is_named_in_its_help() -> None:
    missing = []
    for path, command in _commands():
        if not (command.help or command.short_help):
            missing.append(f"{path} (the command)")
        for option in _options(command):
            if not (option.help or "").strip():
                missing.append(f"{path} {option.opts[0]}")
        for argument in _arguments(command):  # click arguments have no help of their own
            word = argument.human_readable_name.strip("[]. ").split()[0]
            if word not in (command.help or ""):
                missing.append(f"{path} {word} (not named in its help)")
    assert not missing, f"without help: {', '.join(missing)}"


def test_json_means_json_lines_or_one_object_everywhere() -> None:
    names = dict(_commands())
    missing = [path for path, command in names.items()
               if not isinstance(command, click.Group)
               and not any("--json" in o.opts for o in _options(command))]
    assert not missing, f"no --json on: {', '.join(missing)}"
    vague = []
    for path, command in names.items():
        for option in _options(command):
            if "--json" in option.opts:
                help_ = option.help or ""
                if option.opts != ["--json"] or not option.is_flag or not (
                        help_.startswith(JSON_LINES) or help_.startswith(JSON_OBJECT)):
                    vague.append(f"{path}: {option.opts} {help_!r}")
    assert not vague, "--json must be a flag whose help starts with 'JSON Lines: ' or " \
                      f"'one JSON object: ': {vague}"


def test_the_same_nouns_have_the_same_shape() -> None:
    """A session the command acts on is its first argument, SESSION (or ``--session`` where
    a new one may be made); a task is ``--task``, a tool run ``--run``."""
    wrong = []
    for path, command in _commands():
        arguments = _arguments(command)
        for param in command.params:
            if param.name == "session_id":
                first = bool(arguments) and arguments[0] is param
                if not (first and param.human_readable_name.strip("[]") == "SESSION") and \
                        param.opts != ["--session"]:
                    wrong.append(f"{path}: session as {param.opts}")
            elif param.name in NOUNS and param.opts != [NOUNS[param.name]]:
                wrong.append(f"{path}: {param.name} as {param.opts}")
    assert not wrong, wrong


def test_no_aliases_and_no_options_on_groups() -> None:
    """One spelling per option (a short -x beside it is no alias); a subcommand group takes
    none of its subcommands' options (``baton dev --detach`` repeated ``up``'s)."""
    found = []
    for path, command in _commands():
        for option in _options(command):
            longs = [o for o in option.opts if o.startswith("--")]
            if len(longs) > 1:
                found.append(f"{path}: {', '.join(longs)}")
        if isinstance(command, click.Group) and command.params:
            found.append(f"{path}: group options {[p.name for p in command.params]}")
    assert not found, found
