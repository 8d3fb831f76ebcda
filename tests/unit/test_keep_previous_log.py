"""`baton dev up` again in the same directory kept no log of the run before (a crash's last
lines were gone after the restart): the last run's log is kept, one run back."""

from __future__ import annotations

from pathlib import Path

from baton.devkit.supervisor import keep_previous_log


def test_the_last_runs_log_is_kept_one_run_back(tmp_path: Path) -> None:
    log = tmp_path / "brain-1.log"
    keep_previous_log(log)  # nothing yet: nothing to keep
    assert not list(tmp_path.iterdir())
    log.write_text("run 1\n")
    keep_previous_log(log)
    assert (tmp_path / "brain-1.previous.log").read_text() == "run 1\n" and not log.exists()
    log.write_text("")
    keep_previous_log(log)  # an empty log replaces nothing
    assert (tmp_path / "brain-1.previous.log").read_text() == "run 1\n"
    log.write_text("run 3\n")
    keep_previous_log(log)
    assert (tmp_path / "brain-1.previous.log").read_text() == "run 3\n"
