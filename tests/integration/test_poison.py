"""Poison never loops (baton.store.quarantine): a session whose state cannot be decoded is
quarantined after ``poison_limit`` tries, with a dead letter naming the reason, its timers
dropped and the waiting client answered with QuarantinedError. One test per corruption.
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from baton.brain.worker import BrainWorker
from baton.cli.inspect import cluster_view, render_cluster, render_session, session_view
from baton.cli.observe import _live_receipts
from baton.cli.trace import build_trace, render_text
from baton.cli.trace.html import render_html
from baton.cli.watch import Watch, render_change
from baton.client import Client
from baton.errors import QuarantinedError
from baton.examples.notices import app
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.deadletter import dead_letters
from baton.store.keys import SessionKeys
from baton.store.quarantine import quarantine_of
from baton.store.store import Store
from tests.helpers import running, take_up

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
                         "entry 0 does not parse"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
async def test_undecodable_session_is_quarantined(settings: Settings, kind: str) -> None:
    settings = settings.model_copy(update={"poison_limit": 3, "progress_deadline_ms": 500})
    corrupt, expected = CORRUPTIONS[kind]
    async with await Client.connect(settings) as client:
        sub, _ = await client.submit("hello there", agent="notices")
        sid = sub.session_id
        await take_up(client.store, sid)
        sk = client.store.keys.session(sid)
        if kind == "undecodable_task":
            await client.store.redis.hset(sk.tasks, sub.task_id, "{nope")
        else:
            await corrupt(client.store, sk, sid)
        brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-p"}), app)
        relay = Relay(settings.model_copy(update={"worker_name": "relay-p"}))
        async with running(relay, brain):
            with pytest.raises(QuarantinedError) as caught:
                await client.wait(sub, timeout=60)
        record = await quarantine_of(client.store, sid)
        assert record is not None and int(record["tries"]) == 3, record
        reason = record["quarantine_reason"].lower()
        assert expected.lower() in reason, reason
        assert sid in str(caught.value)
        letters = [d for d in await dead_letters(client.store.redis, client.store.keys)
                   if d.get("session_id") == sid]
        assert len(letters) == 1 and "quarantined" in letters[0]["reason"], letters
        timers = await client.store.redis.zrange(sk.timers, 0, -1)
        assert not [t for t in timers if f"|{sid}|" in t], timers


async def test_quarantine_is_shown_by_inspect_trace_and_watch(settings: Settings,
                                                              tmp_path: Path) -> None:
    """Inspect (session and cluster view), trace (text and HTML) and a watch started before
    the quarantine show it with its reason; ``baton submit --wait`` answers with it."""
    settings = settings.model_copy(update={"poison_limit": 3, "progress_deadline_ms": 500})
    async with await Client.connect(settings) as client:
        sub, _ = await client.submit("hello there", agent="notices")
        sid = sub.session_id
        await take_up(client.store, sid)
        await client.store.redis.hdel(client.store.keys.session(sid).meta, "agent")
        events: list[dict[str, Any]] = []
        watch = Watch(settings, sid, events.append, until_settled=True, block_ms=300)
        watching = asyncio.create_task(watch.run())
        brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-q"}), app)
        relay = Relay(settings.model_copy(update={"worker_name": "relay-q"}))
        async with running(relay, brain):
            with pytest.raises(QuarantinedError):
                await client.wait(sub, timeout=60)
        async with asyncio.timeout(60):
            await watching
        shown = [e for e in events if e["type"] == "quarantined"
                 or (e["type"] == "snapshot" and e.get("quarantine"))]
        assert len(shown) == 1, events
        assert "no agent" in render_change(shown[0]) and "QUARANTINED" in render_change(
            shown[0])

        view = await session_view(client.store, sid)
        assert view["quarantine"]["quarantined"] and "no agent" in view["quarantine"]["reason"]
        assert view["quarantine"]["tries"] == 3
        out = io.StringIO()
        render_session(view, Console(file=out, width=200))
        assert "QUARANTINED after 3 tries" in out.getvalue(), out.getvalue()
        cluster = await cluster_view(client.store)
        mine = [s for s in cluster["sessions"] if s["session_id"] == sid]
        assert mine[0]["state"] == "quarantined" and "no agent" in mine[0]["quarantine"]
        assert cluster["sessions_by_state"].get("quarantined") == 1
        out = io.StringIO()
        render_cluster(cluster, Console(file=out, width=200))
        assert f"QUARANTINED session {sid}: " in out.getvalue(), out.getvalue()

        receipts, quarantine, archived_ms = await _live_receipts(settings, sid, None)
        assert archived_ms is None
        trace = build_trace(sid, receipts, quarantine)
        assert "QUARANTINED after 3 tries: " in render_text(trace)
        assert 'class="quarantine"' in render_html(trace) and "no agent" in render_html(trace)
        assert trace.to_json()["quarantine"]["reason"]

    env = {**os.environ, "BATON_DEBUG": "", **settings.to_env(),
           "BATON_HOME": str(tmp_path / "home")}
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "baton", "submit", "--agent", "notices",
                         "--session", sid, "--wait", "--timeout", "30", "again"],
        capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "quarantined" in errors[0] and "no agent" in errors[0], \
        done.stderr
