"""``baton approve`` shows what it asks about as text for a person, on stderr."""

from __future__ import annotations

import click
from click.testing import CliRunner

from baton.cli.common import confirmed
from baton.cli.decide import approval_prompt


def test_the_run_its_tool_and_each_argument_are_shown_on_lines_of_their_own() -> None:
    shown = approval_prompt("t-1-3-0", "send_email",
                            {"to": "ada@example.com", "cc": ["grace@example.com"], "n": 2},
                            "sha256:abc", "awaiting_approval")
    assert shown.splitlines() == [
        "run t-1-3-0 (awaiting_approval) calls send_email with:",
        '  to: "ada@example.com"',
        "  cc: [",
        '      "grace@example.com"',
        "    ]",
        "  n: 2",
        "args digest: sha256:abc",
    ]
    assert "(no arguments)" in approval_prompt("r", "ping", {}, None, "awaiting_approval")


def test_a_no_or_no_answer_is_a_no_and_the_question_line_is_ended() -> None:
    @click.command()
    def ask() -> None:
        click.echo("yes" if confirmed("go?") else "no")

    runner = CliRunner()
    for answer, said in (("y\n", "yes"), ("n\n", "no"), ("", "no")):
        done = runner.invoke(ask, input=answer)
        assert done.exit_code == 0 and done.stdout == f"{said}\n", done.output
        # the question's line is ended, so an error line after it starts a line of its own
        assert done.stderr.startswith("go? [y/N]: ") and done.stderr.endswith("\n")
