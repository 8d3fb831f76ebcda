"""A commit (and the acquire that opens a session) checks the type of every key it touches
before its first write.

commit.lua checks the keys only some write-sets touch (its SELF-GUARDED line) itself, after
reading the index, instead of before every commit: here one write-set touches every session
key, and each key in turn holds a value of the wrong type. The commit must be refused as
corrupt state with nothing written; without its check, each one would fail midway.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from baton.errors import CorruptStateError
from baton.models import Entry, OutboxRow, Submission, Task, Terminal, ToolIntent
from baton.store.documents import next_change
from baton.store.store import Store, worker_ref
from baton.store.writes import Writes
from tests.helpers import contents, take_up

BRAIN = worker_ref("brain", "brain-a")
CLIENT = worker_ref("client", "c")
WAKE = "a.wake.notices.1"
KEYS = ("meta", "entries", "tasks", "done", "docs", "subs", "reqs", "runs", "runs_done",
        "receipts", "outbox", "timers", "intents", "inbox")


async def _session(store: Store) -> tuple[str, int]:
    sid = "g-" + uuid.uuid4().hex[:12]
    task = Task(id=f"{sid}-root", kind="generation", owner=sid)
    await store.inbox.submit(sid, agent="notices", compat=1, wake_subject=WAKE, request_id="r",
                             text="hi", task=task, worker=CLIENT, submission_id=f"{sid}-sub")
    await take_up(store, sid, BRAIN)
    # a request waiting in the inbox, which the commit below takes up (deletes)
    await store.inbox.submit(sid, agent="notices", compat=1, wake_subject=WAKE, request_id="r2",
                             text="more", task=Task(id=f"{sid}-t2", kind="generation", owner=sid),
                             worker=CLIENT, submission_id=f"{sid}-sub2")
    lease = await store.acquire(sid, BRAIN, 60_000)
    return sid, lease.fence


def _everything(sid: str) -> Writes:
    intent = ToolIntent(run_id=f"{sid}-r1", session_id=sid, task_id=f"{sid}-root",
                        tool="send_email", operation_id=f"{sid}-op1", wake_subject=WAKE,
                        group="g")
    done = Task(id=f"{sid}-root", kind="generation", owner=sid,
                state=Terminal(outcome="completed"))
    return Writes(
        entries=[Entry(kind="system", text="x")],
        tasks=[done, Task(id=f"{sid}-t3", kind="custom", owner=sid)],
        documents=[next_change(None, "notes", {"a": 1}, 1, 10)],
        submissions=[Submission(id=f"{sid}-sub3", session_id=sid, request_id="r3",
                                text="x", agent="notices", task_id=f"{sid}-t3")],
        runs=[intent], groups={"g": 1},
        outbox=[OutboxRow(subject="a.tool.send_email", data="{}")],
        deadline_ms=5_000, reqs={"r2": f"{sid}-sub2"}, meta_del=["submit:r2"])


@pytest.mark.parametrize("key", KEYS)
async def test_a_commit_touching_a_key_of_the_wrong_type_writes_nothing(
    store: Store, key: str
) -> None:
    sid, fence = await _session(store)
    sk = store.keys.session(sid)
    names = {k: getattr(sk, k) for k in KEYS}
    await _refused_writing_nothing(store.redis, names, key,
                                   lambda: store.commit(sid, fence, _everything(sid), BRAIN))


async def test_the_write_set_writes_the_keys_it_does_not_only_read(store: Store) -> None:
    """(runs and runs_done are read: a group's count so far, whether a new run exists)"""
    sid, fence = await _session(store)
    sk = store.keys.session(sid)
    await store.commit(sid, fence, _everything(sid), BRAIN)
    r = store.redis
    for name in (sk.entries, sk.done, sk.docs, sk.subs, sk.reqs, sk.outbox,
                 sk.timers, sk.intents):
        assert await r.exists(name), name


@pytest.mark.parametrize("key", ["tasks", "docs", "subs", "runs", "entries", "intents",
                                 "sessions", "receipts"])
async def test_the_acquire_that_opens_a_session_writes_nothing_on_a_key_of_the_wrong_type(
    store: Store, key: str
) -> None:
    """acquire.lua reads the state before opening the session (its first write)."""
    sid = "o-" + uuid.uuid4().hex[:12]
    await store.inbox.submit(sid, agent="notices", compat=1, wake_subject=WAKE, request_id="r",
                             text="hi", task=Task(id=f"{sid}-root", kind="generation", owner=sid),
                             worker=CLIENT, submission_id=f"{sid}-sub")
    sk = store.keys.session(sid)
    names = {k: getattr(sk, k) for k in (*KEYS, "sessions")}
    await _refused_writing_nothing(store.redis, names, key,
                                   lambda: store.acquire_and_load(sid, BRAIN, 60_000))


async def _refused_writing_nothing(r: Any, names: dict[str, str], key: str,
                                   call: Callable[[], Awaitable[Any]]) -> None:
    """With a string where ``names[key]`` should be, ``call`` fails CorruptStateError and
    changes none of ``names``; the key is restored after (a shard's keys are shared with
    other sessions)."""
    kept = await r.dump(names[key])
    await r.delete(names[key])
    await r.set(names[key], "garbage")
    try:
        before = {k: await contents(r, v) for k, v in names.items()}
        with pytest.raises(CorruptStateError):
            await call()
        after = {k: await contents(r, v) for k, v in names.items()}
        assert after == before
    finally:
        await r.delete(names[key])
        if kept is not None:
            await r.restore(names[key], 0, kept)
