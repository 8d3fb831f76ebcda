"""Baton used as a library logs through the application's logging, not onto its stdout."""

from __future__ import annotations

import json
import subprocess
import sys

LIBRARY = """
import json, logging
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append({"name": record.name, "level": record.levelname,
                        "msg": record.getMessage(),
                        "session_id": getattr(record, "session_id", None),
                        "baton_name": getattr(record, "baton_name", None)})
logging.getLogger("baton").addHandler(Keep())
logging.getLogger("baton").setLevel(logging.INFO)
from baton.observability.log import get_logger
log = get_logger("baton.brain").bind(session_id="s-1")
log.info("lease_taken", fence=3, name="clashes with LogRecord.name")
get_logger("baton.relay").debug("not_shown")
import sys
sys.stderr.write(json.dumps(records))
"""

CONFIGURED = """
from baton.observability.log import configure, get_logger
log = get_logger("baton.brain")  # made before configure(), as module-level loggers are
configure("info", "json")
log.bind(session_id="s-1").info("lease_taken", fence=3)
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)


def test_unconfigured_lines_go_to_stdlib_logging_and_not_to_stdout() -> None:
    done = _run(LIBRARY)
    assert done.stdout == ""
    records = json.loads(done.stderr)
    assert records == [{"name": "baton.brain", "level": "INFO",
                        "msg": "lease_taken session_id='s-1' fence=3 "
                               "name='clashes with LogRecord.name'",
                        "session_id": "s-1", "baton_name": "clashes with LogRecord.name"}]


def test_after_configure_lines_are_baton_json_on_stderr() -> None:
    done = _run(CONFIGURED)
    assert done.stdout == ""
    line = json.loads(done.stderr.strip().splitlines()[-1])
    assert line["event"] == "lease_taken" and line["session_id"] == "s-1"
    assert line["fence"] == 3 and line["level"] == "info"
