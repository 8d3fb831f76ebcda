"""A client credential granted some sessions only is refused a session id it did not choose:
the command says why ('acme may not run a Redis key ...' alone did not)."""

from __future__ import annotations

import pytest

from baton.cli.failures import CliError
from baton.cli.submit import _granted_sessions_hint
from baton.errors import ForbiddenError


def _refused() -> ForbiddenError:
    return ForbiddenError("acme", "run", "a Redis key outside its ACL key patterns")


def test_without_a_session_it_says_to_name_one_of_the_grant() -> None:
    with pytest.raises(CliError, match="needs --session with one of them"), \
            _granted_sessions_hint(None, None):
        raise _refused()
    with pytest.raises(CliError, match="made up from the request id"), \
            _granted_sessions_hint(None, "order-17"):
        raise _refused()


def test_with_a_session_it_asks_whether_it_is_granted() -> None:
    with pytest.raises(CliError, match="is session other-1 outside this credential's granted"), \
            _granted_sessions_hint("other-1", None):
        raise _refused()


def test_a_wait_that_timed_out_says_what_it_waits_for() -> None:
    """`baton submit --wait` said only 'is still running after 4 s' while Client.wait knew
    a run awaited approval."""
    from baton.cli.submit import _timed_out
    from baton.errors import WaitTimeout

    exc = WaitTimeout("...", session_id="s-1",
                      why="1 tool run(s) await a decision: `baton approve s-1 --run r`")
    text = _timed_out("submission sub-1", "s-1", "accepted", 4, exc).format_message()
    assert "is still accepted after 4 s (1 tool run(s) await a decision" in text
    plain = _timed_out("submission sub-1", "s-1", "accepted", 4).format_message()
    assert "after 4 s; follow it" in plain
