"""Poison never loops (baton.store.quarantine): a session whose state cannot be decoded is
quarantined after ``poison_limit`` tries, with a dead letter naming the reason, its timers
dropped and the waiting client answered with QuarantinedError. One test per corruption.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from baton.brain.worker import BrainWorker
from baton.client import Client
from baton.errors import QuarantinedError
from baton.examples.notices import app
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.deadletter import dead_letters
from baton.store.keys import SessionKeys
from baton.store.quarantine import quarantine_of
from baton.store.store import Store
from tests.helpers import running

Corrupt = Callable[[Store, SessionKeys, str], Awaitable[Any]]


async def _bad_intent(store: Store, sk: SessionKeys, sid: str) -> None:
    await store.redis.hset(sk.runs, mapping={"r-x.status": "running"})
    await store.redis.hset(sk.intents, "r-x", "{not json")


CORRUPTIONS: dict[str, tuple[Corrupt, str]] = {
    "missing_agent": (lambda s, sk, sid: s.redis.hdel(sk.meta, "agent"), "no agent"),
    "non_numeric_compat": (lambda s, sk, sid: s.redis.hset(sk.meta, "compat", "one"),
                           "compat is not an integer"),
    "non_numeric_fence": (lambda s, sk, sid: s.redis.hset(sk.meta, "fence", "x"),
                          "fence is not an integer"),
    "wrong_type_key": (lambda s, sk, sid: s.redis.set(sk.done, "oops"), "done key is a string"),
    "undecodable_task": (lambda s, sk, sid: s.redis.hset(sk.tasks, f"{sid}-task", "{nope"),
                         "invalid"),
    "undecodable_intent": (_bad_intent, "invalid"),
    "unparsable_entry": (lambda s, sk, sid: s.redis.lset(sk.entries, 0, '{"kind": 7}'),
                         "invalid"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
async def test_undecodable_session_is_quarantined(settings: Settings, kind: str) -> None:
    settings = settings.model_copy(update={"poison_limit": 3, "progress_deadline_ms": 500})
    corrupt, expected = CORRUPTIONS[kind]
    async with await Client.connect(settings) as client:
        sub, _ = await client.submit("hello there", agent="notices")
        sid = sub.session_id
        sk = client.store.keys.session(sid)
        if kind == "undecodable_task":
            await client.store.redis.hset(sk.tasks, sub.task_id, "{nope")
        else:
            await corrupt(client.store, sk, sid)
        brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-p"}), app)
        relay = Relay(settings.model_copy(update={"worker_name": "relay-p"}))
        async with running(relay, brain):
            try:
                final = await client.wait(sub, timeout=60)
            except QuarantinedError as exc:
                caught = exc
            else:
                # An entry is decoded lazily, inside the generation task: its restart limit
                # may fail the task (and settle the submission) first. Either way: no loop.
                assert kind == "unparsable_entry" and final.status == "failed", final
                return
        record = await quarantine_of(client.store, sid)
        assert record is not None and int(record["tries"]) == 3, record
        reason = record["quarantine_reason"].lower()
        assert expected.lower() in reason, reason
        assert sid in str(caught)
        letters = [d for d in await dead_letters(client.store.redis, client.store.keys)
                   if d.get("session_id") == sid]
        assert len(letters) == 1 and "quarantined" in letters[0]["reason"], letters
        timers = await client.store.redis.zrange(sk.timers, 0, -1)
        assert not [t for t in timers if f"|{sid}|" in t], timers
