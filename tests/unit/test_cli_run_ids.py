"""``--run`` resolves the short run ids trace prints against the session's runs."""

from __future__ import annotations

import pytest

from baton.cli.common import resolve_run
from baton.cli.failures import CliError

RUNS = ["gen-aaa111-1-0", "gen-aaa111-2-0", "gen-bbb222-1-0"]


def test_a_full_id_or_an_unambiguous_short_form_names_one_run() -> None:
    assert resolve_run("gen-bbb222-1-0", RUNS) == "gen-bbb222-1-0"
    assert resolve_run("2-0", RUNS) == "gen-aaa111-2-0"
    assert resolve_run("bbb222/1-0", RUNS) == "gen-bbb222-1-0"
    assert resolve_run("222/1-0", RUNS) == "gen-bbb222-1-0"


def test_a_short_form_two_runs_share_is_one_error_naming_both() -> None:
    with pytest.raises(CliError) as caught:
        resolve_run("1-0", RUNS)
    assert caught.value.message == ("run 1-0 is ambiguous: it could be gen-aaa111-1-0, "
                                    "gen-bbb222-1-0; give one of these full ids")


def test_an_id_no_run_has_comes_back_as_given() -> None:
    for given in ("9-9", "ccc333/1-0", "r-1", "", "1-0-"):
        assert resolve_run(given, RUNS) == given
