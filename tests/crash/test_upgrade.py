"""A rolling upgrade with real processes: v1 Brains running sessions mid-way, v2 Brains (with
a migration) started, v1 Brains stopped: every session completes, migrated to compat 2 and
its tasks to version 2. A task only v2 knows is blocked (visibly, never failed) under v1 and
runs under v2; a session at compat 3, which no running Brain serves, stays blocked and
visible in ``inspect`` until a v3 Brain starts, then completes.

Topologies: every test runs on one Redis server;
test_rolling_upgrade_migrates_sessions_and_unserved_level_waits also runs on a 3+6 Redis
Cluster (DevStack(cluster=True)), the file's representative case (a cluster stack takes
seconds to start; the suite's time allows one per file).
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from baton.cli.inspect import cluster_view, session_view
from baton.models import Task
from tests.conftest import TOPOLOGIES
from tests.crash.conftest import Crash, Opener
from tests.helpers import eventually
from tests.version_apps import AGENT

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]

V1, V2, V3 = (f"tests.version_apps:v{n}" for n in (1, 2, 3))
JOBS = 4
SENDS = 4  # per job, one after another


async def _start(c: Crash, kind: str, compat: int, to: str) -> tuple[str, str]:
    sid, tid, created = await c.client.start_task(None, kind, {"to": to, "count": SENDS},
                                                  agent=AGENT, compat=compat)
    assert created
    return sid, tid


async def _done(c: Crash, sid: str, tid: str) -> Task:
    return await c.client.wait_task(sid, tid, timeout=45)


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_rolling_upgrade_migrates_sessions_and_unserved_level_waits(
    crash: Opener, topology: str,
) -> None:
    c = await crash(brains=2, hands=2, app_spec=V1)
    # The mail service holds every answer until released: each job's first mail is accepted
    # and none is answered, so every job is mid-way under v1 however slow the machine is.
    await c.http.post("/hold")
    jobs = [await _start(c, "job", 1, f"user{i}@example.com") for i in range(JOBS)]
    extra = (await c.client.start_task(None, "extra", {}, agent=AGENT, compat=1))[:2]

    # v1 cannot run "extra": blocked, with its reason, never failed.
    async def extra_blocked() -> Any:
        view = await session_view(c.store, extra[0])
        return view["blocked"]["tasks"].get(extra[1])
    reason = await eventually(extra_blocked, timeout=15, message="extra blocked under v1")
    assert "no definition of task kind 'extra'" in reason

    async def midway() -> bool:  # every job has one mail accepted and held, none finished
        stats = await c.stats()
        return stats["accepted"] == stats["held"] == JOBS
    await eventually(midway, timeout=30, message="jobs mid-way under v1")
    tasks = [await c.store.inbox.task(s, t) for s, t in jobs]
    assert not any(t.terminal for t in tasks) and all(t.version == 1 for t in tasks)

    for n in (1, 2):
        await c.stack.spawn("brain", f"brain-v2-{n}", app=V2)
    for old in ("brain-1", "brain-2"):
        c.stack.kill(old, signal.SIGTERM, respawn=False)
    for old in ("brain-1", "brain-2"):
        assert await c.stack.wait_exit(old, timeout=20) == 0
    await c.http.post("/release")  # the held mails are answered; only v2 Brains are left

    # A session at a level no running Brain serves waits, visibly.
    later = await _start(c, "job", 3, "late@example.com")

    async def unserved() -> Any:
        cluster = await cluster_view(c.store)
        return [s for s in cluster["blocked_sessions"] if s["session_id"] == later[0]]
    shown = await eventually(unserved, timeout=10, message="compat-3 session blocked")
    assert "no live Brain serves upgrade compat 3" in shown[0]["blocked"]

    for sid, tid in [*jobs, extra]:
        task = await _done(c, sid, tid)
        assert task.state.outcome == "completed", (sid, task.state)  # type: ignore[union-attr]
        assert (task.result["finished_by"] == 2 and task.version == 2) or task.kind == "extra"
        view = await session_view(c.store, sid)
        assert view["compat"] == 2 and view["wake_subject"].endswith(f".{AGENT}.2")
        assert view["blocked"] == {"level": None, "tasks": {}}
    results = [(await c.store.inbox.task(s, t)).result for s, t in jobs]
    assert all(r["sent"] == SENDS for r in results)
    # Mid-way sessions were migrated by v2: its migrate recorded where they came from.
    assert all(r["migrated_from"] == 1 for r in results), results
    receipts = [r for s, _ in jobs for r in await c.receipts(s)]
    assert sum(getattr(r.detail, "step", None) == "migrate" for r in receipts) == JOBS
    stats = await c.stats()
    assert stats["accepted"] == JOBS * SENDS + 0  # each notice once, none twice

    later_task = await c.store.inbox.task(*later)
    assert not later_task.terminal and later_task.state.name == "pending"
    view = await session_view(c.store, later[0])
    assert view["blocked"]["level"] and view["tasks"][0]["blocked"].startswith("blocked:")

    await c.stack.spawn("brain", "brain-v3", app=V3)
    task = await _done(c, *later)
    assert task.state.outcome == "completed" and task.result["finished_by"] == 3  # type: ignore[union-attr]
    assert task.version == 3
    assert not [s for s in (await cluster_view(c.store))["blocked_sessions"]
                if s["session_id"] == later[0]]
