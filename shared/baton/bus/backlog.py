"""Messages waiting in JetStream, per subject, and whether anything live will take them.

A wake for an agent/compat level no Brain serves, or a tool message for a tool no Hands
serves, sits in its stream until it ages out: no consumer fetches it, and nothing else
would show it. :func:`subject_backlog` reads the streams' per-subject counts and the
consumers' filters (stream and consumer info only: no message is fetched or acked), and
marks each subject with its oldest message's age and who should be taking it:

- ``consumer``: the durable consumer whose filter takes the subject (None: none exists);
- ``served``: a live worker announced serving it (a Brain its agent/compat level, a Hands
  its tool); None when the caller passed no announcements.

Read by ``baton inspect`` (cluster view). Needs the JetStream API's info requests and the
streams' message reads (the ``operator`` user in a deployment with per-role NATS users, see
:func:`baton.auth.nats_permissions`).

:func:`consumer_backlog` is the cheaper reading the relay samples for the ``baton.backlog``
gauge: the streams' per-subject counts only (stream info, which the relay may read), by the
durable consumer that takes each subject. The streams are work queues (a message is gone
once acked), so a subject's count is its consumer's ``num_pending + num_ack_pending``: the
lag KEDA's NATS JetStream scaler reads (deploy/k8s/scaling/).
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import nats.js.errors
from nats.js import JetStreamContext

from baton.bus.subjects import BusNames
from baton.errors import ValidationError

__all__ = ["consumer_backlog", "subject_backlog"]

MAX_SUBJECTS = 200  # per stream, the subjects with messages that are reported


def _matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` the rest."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


async def subject_backlog(
    js: JetStreamContext, names: BusNames,
    served_levels: set[tuple[str, int]] | None = None,
    served_tools: set[str] | None = None,
) -> list[dict[str, Any]]:
    """One row per subject with messages in the wake and tool streams, oldest first."""
    now_s = time.time()
    rows: list[dict[str, Any]] = []
    for kind, stream in (("wake", names.wake_stream), ("tool", names.tool_stream)):
        try:
            info = await js.stream_info(stream, subjects_filter=">")
        except nats.js.errors.NotFoundError:
            continue
        counts: dict[str, int] = dict(info.state.subjects or {})
        consumers = await js.consumers_info(stream)
        for subject, count in sorted(counts.items(), key=lambda kv: -kv[1])[:MAX_SUBJECTS]:
            if not count:
                continue
            consumer = next((c.name for c in consumers
                             if _matches(c.config.filter_subject or ">", subject)), None)
            oldest = await js.get_msg(stream, seq=1, subject=subject, next=True)
            stamp: Any = oldest.time if oldest is not None else None  # a datetime (UTC)
            age_ms = (max(int((now_s - stamp.timestamp()) * 1000), 0)
                      if isinstance(stamp, datetime) else None)
            tokens = subject.split(".")
            served: bool | None = None
            if kind == "wake" and served_levels is not None and len(tokens) >= 4:
                served = (tokens[2], _int(tokens[3])) in served_levels
            elif kind == "tool" and served_tools is not None and len(tokens) >= 3:
                served = tokens[2] in served_tools
            rows.append({"stream": stream, "kind": kind, "subject": subject,
                         "messages": count, "oldest_age_ms": age_ms,
                         "consumer": consumer, "served": served})
    rows.sort(key=lambda r: -(r["oldest_age_ms"] or 0))
    return rows


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return -1



async def consumer_backlog(js: JetStreamContext, names: BusNames) -> dict[tuple[str, str], int]:
    """``(stream, durable consumer) -> messages not yet acked`` for every subject of the wake
    and tool streams that holds messages (a subject without messages is absent). The
    consumer is the durable name :class:`BusNames` gives the subject (``wake_<agent>_<compat>``,
    ``tool_<tool>``), whether or not it exists yet."""
    found: dict[tuple[str, str], int] = {}
    for kind, stream in (("wake", names.wake_stream), ("tool", names.tool_stream)):
        try:
            info = await js.stream_info(stream, subjects_filter=">")
        except nats.js.errors.NotFoundError:
            continue
        prefix = f"{names.namespace}.{kind}."
        for subject, count in (info.state.subjects or {}).items():
            if not count or not subject.startswith(prefix):
                continue
            tokens = subject[len(prefix):].split(".")
            try:
                durable = (names.wake_durable(*tokens) if kind == "wake" and len(tokens) == 2
                           else names.tool_durable(tokens[0]) if len(tokens) == 1 else None)
            except ValidationError:  # a token no durable name may hold
                durable = None
            if durable is not None:
                found[(stream, durable)] = found.get((stream, durable), 0) + int(count)
    return found
