"""The crash-suite harness: one private DevStack per test (own Redis, NATS, mail service and
Brain/Hands/relay processes), short timings, and the checks every crash test makes.

Every wait is a poll with a deadline; a failing wait reports the end of each service's log.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from baton.client import Client
from baton.devkit.devstack import DevStack, Proc
from baton.errors import ServerError
from baton.models import Entry, Running, Submission, ToolRun
from baton.receipts import Receipt
from baton.store.store import Store

ROOT = Path(__file__).resolve().parents[2]

FIVE_NOTICES = (
    "Send the approved notice to ada@example.com, grace@example.com, linus@example.com, "
    "margaret@example.com and barbara@example.com, then summarise."
)
RECIPIENTS = ("ada@example.com", "grace@example.com", "linus@example.com",
              "margaret@example.com", "barbara@example.com")

# Short timings so that a takeover happens within about a second.
CRASH_ENV = {
    "BATON_ACK_WAIT_S": "1",
    "BATON_ATTEMPT_TTL_MS": "800",
    "BATON_LEASE_MS": "1000",
    "BATON_RELAY_CLAIM_IDLE_MS": "500",
    "BATON_PROGRESS_DEADLINE_MS": "2000",
}
SETTLE_S = 30.0  # a session of this suite completes within this, crash included


class Crash:
    """A started stack plus a client, the mail service's HTTP API and the checks."""

    def __init__(self, stack: DevStack, client: Client, http: httpx.AsyncClient) -> None:
        self.stack = stack
        self.client = client
        self.http = http

    @property
    def store(self) -> Store:
        return self.client.store

    # ------------------------------------------------------------------ processes

    async def spawn_armed(self, role: str, point: str, *, name: str | None = None,
                          env: dict[str, str] | None = None) -> Proc:
        """A replica that SIGKILLs itself at ``point`` and is never restarted (a restart
        would carry the fault again).

        Work may be waiting for it, so it can reach its point before its readiness is seen:
        returned once it serves or once it died there."""
        proc = await self.stack.spawn(role, name or f"{role}-armed",
                                      {**(env or {}), "BATON_FAULT": point},
                                      wait=False, respawn=False)
        try:
            await self.stack.wait_ready(proc.name)
        except ServerError:
            where = point.partition("@")[0]
            if not self.events(proc.name, "fault_point_hit", point=where):
                raise
        return proc

    async def died_at(self, name: str, point: str, timeout: float = 20.0) -> None:  # noqa: ASYNC109
        """``name`` was SIGKILLed by its fault point ``point`` (exit signal and log line)."""
        try:
            code = await self.stack.wait_exit(name, timeout)
        except TimeoutError:
            raise AssertionError(f"{name} did not die at {point} within {timeout}s\n"
                                 f"{self.tails()}") from None
        assert code == -signal.SIGKILL, f"{name} exited with {code}, not SIGKILL"
        hits = [e for e in self.events(name, "fault_point_hit") if e.get("point") == point]
        tail = self.stack.proc(name).log_tail()
        assert hits, f"no fault_point_hit {point} in {name}'s log:\n{tail}"

    async def replace(self, name: str, *, env: dict[str, str] | None = None) -> Proc:
        """Once ``name`` is dead, start a clean replica of its role (no fault)."""
        old = self.stack.proc(name)
        assert not old.alive
        return await self.stack.spawn(old.role, f"{old.role}-clean", env)

    def events(self, name: str, event: str | None = None, **match: Any) -> list[dict[str, Any]]:
        """The JSON log lines of process ``name`` (all incarnations), optionally filtered."""
        out = []
        try:
            lines = self.stack.proc(name).log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        for line in lines:
            if not line.startswith("{"):
                continue
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if event is not None and item.get("event") != event:
                continue
            if all(item.get(k) == v for k, v in match.items()):
                out.append(item)
        return out

    def tails(self, lines: int = 15) -> str:
        return "\n".join(f"--- {p.name} (pid {p.pid}, alive {p.alive})\n{p.log_tail(lines)}"
                         for p in self.stack.procs())

    async def run_armed(self, role: str, spec: str, *, env: dict[str, str] | None = None,
                        fates: dict[str, str] | None = None) -> tuple[Submission, Proc, Proc]:
        """Submit with an armed replica alone in its role, replace it once it died at its
        fault point, and check the session completed with one mail per recipient.

        Returns (the submission, the armed replica, the clean one)."""
        point = spec.partition("@")[0]
        armed = await self.spawn_armed(role, spec, env=env)
        sub = await self.submit()
        await self.died_at(armed.name, point)
        clean = await self.replace(armed.name, env=env)
        final = await self.settle(sub)
        await self.check_completed(final, fates)
        await self.check_exactly_once(raw_requests=5)  # nothing re-sent raw: confirm sufficed
        return sub, armed, clean

    async def brain_in_request(self, session: str) -> tuple[str, int] | None:
        """The Brain inside the model call of the session's generation task, and its fence."""
        state = await self.store.load(session)
        for task in state.tasks.values():
            running = task.state
            if (isinstance(running, Running) and task.checkpoint.phase == "request"
                    and running.fence == state.meta.fence
                    and state.meta.holder == running.worker):
                return running.worker, running.fence
        return None

    # ------------------------------------------------------------------ sessions

    async def submit(self, text: str = FIVE_NOTICES, **kwargs: Any) -> Submission:
        sub, created = await self.client.submit(text, agent="notices", **kwargs)
        assert created
        return sub

    async def settle(self, sub: Submission, timeout: float = SETTLE_S) -> Submission:  # noqa: ASYNC109
        try:
            return await self.client.wait(sub, timeout=timeout)
        except TimeoutError:
            state = await self.store.load(sub.session_id)
            raise AssertionError(
                f"submission {sub.id} not settled within {timeout}s; tasks "
                f"{[t.state for t in state.tasks.values()]}; runs "
                f"{[(r.run_id, r.status, r.worker) for r in await self.runs(sub.session_id)]}\n"
                f"{self.tails()}") from None

    async def runs(self, session: str) -> list[ToolRun]:
        """Live and applied runs, in the order the model called them."""
        found = {**await self.store.runs.applied(session), **(await self.store.load(session)).runs}
        return sorted(found.values(), key=lambda r: r.run_id)

    async def receipts(self, session: str, kind: str | None = None) -> list[Receipt]:
        return [r for r in await self.store.receipts(session) if kind in (None, r.kind)]

    async def entries(self, session: str) -> list[Entry]:
        return await self.store.entries(session)

    async def stats(self) -> dict[str, Any]:
        return dict((await self.http.get("/stats")).json())

    async def accepted(self, operation_id: str) -> bool:
        """Whether the mail service recorded this operation."""
        return (await self.http.get(f"/operations/{operation_id}")).status_code == 200

    # ------------------------------------------------------------------ checks

    async def check_interrupted_transcript(self, final: Submission, partial: str) -> list[Entry]:
        """Completed after a Brain died mid-stream: the cut-off answer (``partial``) kept as an
        ``interrupted`` entry, then one model turn with five calls, five results, a summary."""
        assert final.status == "completed", final
        for to in RECIPIENTS:
            assert f"{to}: sent" in (final.answer or ""), final.answer
        entries = await self.entries(final.session_id)
        assert [e.kind for e in entries] == \
            ["user", "interrupted", "model", *["tool_result"] * 5, "model"]
        assert entries[1].text == partial and not entries[1].tool_calls
        return entries

    async def check_exactly_once(self, raw_requests: int = 5) -> dict[str, Any]:
        """Every recipient got exactly one mail; ``raw_requests`` sends reached the service."""
        stats = await self.stats()
        assert stats["deliveries"] == {r: 1 for r in RECIPIENTS}, stats
        assert stats["accepted"] == len(RECIPIENTS), stats
        assert stats["raw_requests"] == raw_requests, stats
        return stats

    async def check_completed(self, final: Submission, fates: dict[str, str] | None = None
                              ) -> None:
        """Completed, with one transcript: the input, one model turn with five calls, five
        results and one summary naming each recipient's fate (``sent`` unless given)."""
        assert final.status == "completed", final
        expected = {r: "sent" for r in RECIPIENTS} | (fates or {})
        answer = final.answer or ""
        for to, fate in expected.items():
            assert f"{to}: {fate}" in answer, (to, fate, answer)
        entries = await self.entries(final.session_id)
        kinds = [e.kind for e in entries]
        assert kinds == ["user", "model", *["tool_result"] * 5, "model"], kinds
        assert len(entries[1].tool_calls) == 5
        assert sorted(e.tool_call_id or "" for e in entries[2:7]) == \
            sorted(c.id for c in entries[1].tool_calls)
        assert entries[-1].text == answer
        runs = await self.runs(final.session_id)
        assert len(runs) == 5 and all(r.applied_ms for r in runs), runs


Opener = Callable[..., Awaitable[Crash]]


@pytest.fixture
async def crash(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Opener]:
    """``c = await crash(brains=1, hands=2, ...)``: a started stack; stopped after the test.

    Keyword arguments go to :class:`DevStack`; ``env`` adds to :data:`CRASH_ENV`. A test
    parametrized with ``topology="cluster"`` gets a stack on a 3+6 Redis Cluster (3 primaries,
    2 replicas each) and three NATS nodes (``DevStack(cluster=True)``).
    """
    opened: list[Crash] = []
    callspec = getattr(request.node, "callspec", None)
    cluster = callspec is not None and callspec.params.get("topology") == "cluster"

    async def open_stack(**kwargs: Any) -> Crash:
        kwargs.setdefault("cluster", cluster)
        env = {**CRASH_ENV, **kwargs.pop("env", {})}
        # The services import the test apps (tests.apps) from the repository root.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        stack = DevStack(tmp_path / f"stack-{len(opened)}", env=env, **kwargs)
        await stack.start()
        try:
            client = await Client.connect(stack.settings())
        except BaseException:
            await stack.stop()
            raise
        crash = Crash(stack, client, httpx.AsyncClient(base_url=stack.mail_url, timeout=5.0))
        opened.append(crash)
        return crash

    try:
        yield open_stack
    finally:
        for c in opened:
            await c.http.aclose()
            await c.client.close()
            await c.stack.stop()


__all__ = ["CRASH_ENV", "FIVE_NOTICES", "RECIPIENTS", "Crash", "Opener"]
