"""The settled notification's message (baton.store.notices): pure format, no server."""

from __future__ import annotations

from baton.models import Submission
from baton.store.notices import NOTICE_MAX_BYTES, settled_notice, submission_in

SUB = Submission(id="sub-1", session_id="s-1", request_id="r-1", agent="notices", text="hi",
                 task_id="gen-1",
                 status="completed", answer="done", settled_ms=5)


def test_a_settled_submission_is_announced_with_its_record() -> None:
    message = settled_notice(SUB)
    assert submission_in(message, SUB) == SUB
    assert submission_in(message.encode(), SUB) == SUB  # as a client without decoding gets it


def test_a_long_answer_is_announced_by_its_id_alone() -> None:
    long = SUB.model_copy(update={"answer": "x" * NOTICE_MAX_BYTES})
    assert settled_notice(long) == long.id
    assert submission_in(settled_notice(long), long) is None  # the waiter reads it then


def test_a_notice_that_does_not_carry_the_awaited_submission_is_only_a_wake_up() -> None:
    other = SUB.model_copy(update={"id": "sub-2", "request_id": "r-2"})
    elsewhere = SUB.model_copy(update={"session_id": "s-2"})
    running = SUB.model_copy(update={"status": "running", "settled_ms": None, "answer": None})
    for message in (settled_notice(other), settled_notice(elsewhere), settled_notice(running),
                    "sub-1", "task:gen-1", '{"id": "sub-1"', '{"id": "sub-1"}', None, 42):
        assert submission_in(message, SUB) is None, message
