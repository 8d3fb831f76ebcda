"""The settled notification: what a commit that settles a submission SPUBLISHes on the
session's channel (:meth:`~baton.store.keys.Keys.settled_channel`), and how a waiting
client reads it.

The message is the settled submission's JSON, published by the commit script after its
writes, so it is the committed record itself: :meth:`~baton.client.Client.wait` returns it
without reading the submission back (one round trip less per wait). A submission whose JSON
is over :data:`NOTICE_MAX_BYTES` (a long answer) is announced by its id alone, and so are
other settlements (``task:<id>``); a waiter then reads the state, as it does for a notice it
cannot use (another submission's, or one an older Brain sent).

Only Brains may SPUBLISH there (:mod:`baton.auth`), and the client still decodes and checks
what it hears: a notice that does not parse, names another submission or is not settled is
only a wake-up.
"""

from __future__ import annotations

from typing import Any

from baton.errors import ValidationError
from baton.models import Submission, decode

__all__ = ["NOTICE_MAX_BYTES", "settled_notice", "submission_in"]

#: Past this size the notice names the submission only: every waiter on the session's
#: channel receives it, whichever submission it waits for.
NOTICE_MAX_BYTES = 16 * 1024


def settled_notice(settled: Submission) -> str:
    """The message announcing ``settled``: its JSON, or its id when that is too long."""
    raw = settled.to_json()
    return raw if len(raw) <= NOTICE_MAX_BYTES else settled.id


def submission_in(message: Any, wanted: Submission) -> Submission | None:
    """The settled ``wanted`` submission carried by a notice, or None when the notice does
    not carry it (an id, another submission's, unsettled, malformed)."""
    if isinstance(message, bytes | bytearray):
        message = bytes(message).decode("utf-8", "replace")
    if not isinstance(message, str) or not message.startswith("{"):
        return None
    try:
        found = decode(Submission, message)
    except ValidationError:
        return None
    if found.id != wanted.id or found.session_id != wanted.session_id or not found.settled:
        return None
    return found
