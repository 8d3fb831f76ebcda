"""``baton inspect`` never prints a traceback: a key of the wrong type, a missing hash or
JSON that does not parse, anywhere the session or cluster view reads, is a finding naming
the key, and the rest of the view is shown. On one Redis server and on a Redis Cluster.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from baton.cli.inspect import cluster_view, render_cluster, render_session, session_view
from baton.client import Client
from baton.settings import Settings
from baton.store.keys import Keys, SessionKeys
from baton.store.store import Store
from tests.conftest import TOPOLOGIES
from tests.helpers import take_up

Corrupt = Callable[[Any, Keys, SessionKeys, str], Awaitable[Any]]


async def _replace(r: Any, key: str, value: str = "oops") -> None:
    """Put a string where another type belongs (the key's old value is gone)."""
    await r.delete(key)
    await r.set(key, value)


async def _both(*writes: Any) -> None:
    for write in writes:
        await write


async def _hash_instead(r: Any, key: str) -> None:
    await r.delete(key)
    await r.hset(key, "x", "y")


#: name -> (corrupt the store, a substring of the finding it must produce). The session
#: view and the cluster view each must show it where they read the key.
SESSION_KEYS: dict[str, tuple[Corrupt, str]] = {
    "meta_wrong_type": (lambda r, k, sk, sid: _replace(r, sk.meta), "WRONGTYPE"),
    "meta_missing": (lambda r, k, sk, sid: r.delete(sk.meta), "missing"),
    "meta_missing_agent": (lambda r, k, sk, sid: r.hdel(sk.meta, "agent"), "no agent"),
    "meta_bad_fence": (lambda r, k, sk, sid: r.hset(sk.meta, "fence", "x"),
                       "fence is not an integer"),
    "meta_bad_compat": (lambda r, k, sk, sid: r.hset(sk.meta, "compat", "one"),
                        "compat is not an integer"),
    "tasks_wrong_type": (lambda r, k, sk, sid: _replace(r, sk.tasks), "WRONGTYPE"),
    "task_garbage": (lambda r, k, sk, sid: r.hset(sk.tasks, "t-bad", "{nope"), "t-bad"),
    "done_wrong_type": (lambda r, k, sk, sid: _replace(r, sk.done), "WRONGTYPE"),
    "subs_wrong_type": (lambda r, k, sk, sid: _replace(r, sk.subs), "WRONGTYPE"),
    "sub_garbage": (lambda r, k, sk, sid: r.hset(sk.subs, "sub-bad", "[1, 2"), "sub-bad"),
    "runs_wrong_type": (lambda r, k, sk, sid: _replace(r, sk.runs), "WRONGTYPE"),
    # A live run's intent is kept in the Brain-only intents hash, its progress in the runs.
    "run_garbage": (lambda r, k, sk, sid: _both(r.hset(sk.intents, "r-x", "{bad"),
                                                r.hset(sk.runs, "r-x.status", "running")),
                    "r-x"),
    "intents_wrong_type": (lambda r, k, sk, sid: _replace(r, sk.intents), "WRONGTYPE"),
    "runs_done_wrong_type": (lambda r, k, sk, sid: _replace(r, sk.runs_done), "WRONGTYPE"),
    "entries_wrong_type": (lambda r, k, sk, sid: _replace(r, sk.entries), "WRONGTYPE"),
    "entry_garbage": (lambda r, k, sk, sid: r.rpush(sk.entries, '{"kind": 7}'),
                      "does not parse"),
    "receipts_wrong_type": (lambda r, k, sk, sid: _hash_instead(r, sk.receipts), "WRONGTYPE"),
    "poison_wrong_type": (lambda r, k, sk, sid: _replace(r, sk.poison), "WRONGTYPE"),
    "timers_wrong_type": (lambda r, k, sk, sid: _replace(r, sk.timers), "WRONGTYPE"),
}

def _brains(k: Keys, shard: int, log: str) -> str:
    """The Brains' liveness hash or dead-letter stream of a shard."""
    return f"{k.ns}:{k.tag(shard)}:{log}:brain"


#: Keys only the shared parts of the views read (services, index, backlog, dead letters,
#: epoch), corrupted on the session's shard.
SHARED_KEYS: dict[str, tuple[Corrupt, str]] = {
    "workers_wrong_type": (lambda r, k, sk, sid: _replace(r, _brains(k, sk.shard, "workers")),
                           "WRONGTYPE"),
    "service_garbage": (lambda r, k, sk, sid: r.hset(_brains(k, sk.shard, "workers"),
                                                     "brain:x", "{nope"), "brain:x"),
    "service_wrong_shape": (lambda r, k, sk, sid: r.hset(
        _brains(k, sk.shard, "workers"), "brain:y", '{"seen_ms": "soon", "serves": [[1]]}'),
        "brain:y"),
    "sessions_wrong_type": (lambda r, k, sk, sid: _replace(r, k.sessions(sk.shard)),
                            "WRONGTYPE"),
    "dead_wrong_type": (lambda r, k, sk, sid: _replace(r, _brains(k, sk.shard, "dead")),
                        "WRONGTYPE"),
    "outbox_wrong_type": (lambda r, k, sk, sid: _replace(r, k.outbox(sk.shard)), "WRONGTYPE"),
    "epoch_wrong_type": (lambda r, k, sk, sid: _hash_instead(r, k.epoch(sk.shard)),
                         "WRONGTYPE"),
}

CASES = {**SESSION_KEYS, **SHARED_KEYS}
CLUSTER_READS = {"meta_wrong_type", "meta_missing_agent", "meta_bad_fence", "meta_bad_compat",
                 "tasks_wrong_type", "subs_wrong_type", "sub_garbage", "poison_wrong_type"}


def _rendered(view: dict[str, Any], render: Callable[[dict[str, Any], Console], None]) -> str:
    out = io.StringIO()
    render(view, Console(file=out, width=160, highlight=False))
    return out.getvalue()


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("kind", sorted(CASES))
async def test_inspect_reports_corruption_as_a_finding(topo_settings: Settings, topology: str,
                                                       kind: str) -> None:
    corrupt, expected = CASES[kind]
    async with await Client.connect(topo_settings) as client:
        sub, _ = await client.submit("hello [red]there", agent="notices")
        store: Store = client.store
        await take_up(store, sub.session_id)
        sk = store.keys.session(sub.session_id)
        await corrupt(store.redis, store.keys, sk, sub.session_id)

        session = await session_view(store, sub.session_id)
        cluster = await cluster_view(store)
        text = _rendered(session, render_session) + _rendered(cluster, render_cluster)
    json.dumps(session, default=str), json.dumps(cluster, default=str)
    found = session["findings"] + cluster["findings"]
    assert any(expected in line for line in found), found
    assert "FINDINGS" in text and expected in text, text
    if kind in CLUSTER_READS:  # the cluster view reads meta, tasks, submissions, poison
        mine = [s for s in cluster["sessions"] if s["session_id"] == sub.session_id]
        assert mine and mine[0]["state"] == "unreadable", cluster


async def test_inspect_cli_on_a_corrupt_store(settings: Settings, tmp_path: Path) -> None:
    """The command itself: exit 0, findings in the output, no traceback."""
    async with await Client.connect(settings) as client:
        sub, _ = await client.submit("hello", agent="notices")
        await take_up(client.store, sub.session_id)
        sk = client.store.keys.session(sub.session_id)
        await _replace(client.store.redis, sk.tasks)
        await _replace(client.store.redis, client.store.keys.every("dead")[0])
        await _replace(client.store.redis, client.store.keys.every("workers")[1])
    env = {**os.environ, "BATON_DEBUG": "", **settings.to_env(),
           "BATON_HOME": str(tmp_path / "home")}
    for args in ((sub.session_id,), (), (sub.session_id, "--json"), ("--json",)):
        done = await _run([sys.executable, "-m", "baton", "inspect", *args], env)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr + done.stdout, done.stderr
        assert "WRONGTYPE" in done.stdout, done.stdout


async def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True,
                                   timeout=120, check=False, env=env)
