"""The Hands worker: a stale attempt (taken over, or completing after a newer one) never
completes the run, and a shutdown drains the tool in flight."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from baton.app import ToolContext
from baton.bus.bus import Bus
from baton.devkit.mailbox import MailboxServer
from baton.errors import RedisUnavailable, StaleAttemptError
from baton.hands import HandsWorker
from baton.models import ToolIntent, ToolResult
from baton.settings import Settings
from baton.store.state import Claim
from baton.store.store import Store
from tests.helpers import eventually
from tests.integration.hands_app import (
    APP,
    CALLS,
    HOOKS,
    OTHER_HANDS,
    commit_runs,
    dispatch,
    make_intent,
    new_id,
    result_of,
    running,
    settled,
)

# ---------------------------------------------------------------- stale Hands


async def _take_over(store: Store, intent: ToolIntent) -> Claim:
    """A paused worker's heartbeat lapses and another Hands claims the run."""
    sk = store.keys.session(intent.session_id)
    await store.redis.hset(sk.runs, f"{intent.run_id}.heartbeat", 0)
    claim = await store.runs.claim(intent.session_id, intent.run_id, OTHER_HANDS, delivery=2)
    assert claim.status == "claimed" and claim.recovering
    return claim


async def test_a_taken_over_attempt_is_cancelled_and_never_completes(
    hs: Settings, store: Store, bus: Bus
) -> None:
    session = new_id("s")
    intent = make_intent(bus, session, "gate", {})
    await commit_runs(store, bus, session, [intent])
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def hold(ctx: ToolContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    HOOKS[intent.run_id] = hold
    async with running(hs, tools=["gate"]):
        await dispatch(bus, intent)
        await asyncio.wait_for(started.wait(), 10)
        second = await _take_over(store, intent)
        await asyncio.wait_for(cancelled.wait(), 10)  # the heartbeat saw the takeover
        winner = ToolResult(outcome="ok", output={"by": "hands-b"}, attempt=second.attempt)
        await store.runs.complete(session, intent, second.attempt, winner, OTHER_HANDS)
        # The old message comes back after ack_wait and is acked as a duplicate.
        await settled(bus, "gate")
    assert (await result_of(store, intent)) == winner
    # The stale attempt learnt of the takeover from its heartbeat (a traced refusal) and
    # never tried to complete.
    refused = [r for r in await store.receipts(session) if r.kind == "refused"]
    assert refused and {r.detail.op for r in refused} == {"heartbeat"}
    assert CALLS[intent.run_id] == 1


async def test_a_claim_answered_after_its_attempt_was_taken_over_runs_nothing(
    hs: Settings, store: Store, bus: Bus
) -> None:
    """A claim whose reply comes late (a replica's acknowledgement waited for during a Redis
    failover): meanwhile the attempt lapsed and another Hands took the run over. The late
    claimer beats the attempt once before acting, learns it is stale, and never runs the
    tool (it ran it, beside the new owner)."""
    session = new_id("s")
    intent = make_intent(bus, session, "gate", {})
    await commit_runs(store, bus, session, [intent])
    async def ran(ctx: ToolContext) -> dict[str, bool]:
        return {"ran": True}

    HOOKS[intent.run_id] = ran
    winner: list[ToolResult] = []

    async with running(hs, tools=["gate"]) as worker:
        assert worker.store is not None
        runs = worker.store.runs
        real_claim = runs.claim

        async def answered_late(*args: Any, **kwargs: Any) -> Claim:
            claim = await real_claim(*args, **kwargs)
            if claim.status == "claimed" and not winner:
                async def taken() -> Claim | None:  # once the attempt lapses, unbeaten
                    other = await store.runs.claim(session, intent.run_id, OTHER_HANDS,
                                                   delivery=2)
                    return other if other.status == "claimed" else None
                second = await eventually(taken, timeout=30, message="takeover")
                result = ToolResult(outcome="ok", output={"by": "hands-b"},
                                    attempt=second.attempt)
                await store.runs.complete(session, intent, second.attempt, result, OTHER_HANDS)
                winner.append(result)
            return claim

        runs.claim = answered_late  # type: ignore[method-assign]
        await dispatch(bus, intent)
        await settled(bus, "gate")
    assert winner and (await result_of(store, intent)) == winner[0]
    assert CALLS[intent.run_id] == 0  # the late claimer ran nothing
    refused = [r for r in await store.receipts(session) if r.kind == "refused"]
    assert {r.detail.op for r in refused} == {"heartbeat"}, refused


async def test_a_stale_attempts_complete_is_refused_and_the_new_result_stands(
    hs: Settings, store: Store, bus: Bus
) -> None:
    session = new_id("s")
    intent = make_intent(bus, session, "gate", {})
    await commit_runs(store, bus, session, [intent])
    taken: list[Claim] = []

    async def lose_the_run(ctx: ToolContext) -> dict[str, str]:
        taken.append(await _take_over(store, intent))  # paused past the ttl, then resumes
        return {"by": "hands-t"}

    HOOKS[intent.run_id] = lose_the_run

    async def refused() -> bool:
        return any(r.kind == "refused" for r in await store.receipts(session))

    async with running(hs, tools=["gate"]):
        await dispatch(bus, intent)
        await eventually(refused, timeout=10, message="stale complete refused")
        second = taken[0]
        winner = ToolResult(outcome="ok", output={"by": "hands-b"}, attempt=second.attempt)
        await store.runs.complete(session, intent, second.attempt, winner, OTHER_HANDS)
        await settled(bus, "gate")
    assert (await result_of(store, intent)) == winner
    refusal = next(r for r in await store.receipts(session) if r.kind == "refused")
    assert refusal.detail.current == 2 and refusal.worker and refusal.worker.name == "hands-t"


async def test_a_retried_complete_that_had_landed_counts_as_completed(settings: Settings) -> None:
    """A complete whose reply was lost is retried; finding it applied is success, not refusal."""
    worker = HandsWorker(settings, APP, ["echo"])
    intent = ToolIntent(run_id="r", session_id="s", task_id="t", tool="echo",
                        operation_id="op-r", wake_subject="x")
    result = ToolResult(outcome="ok", attempt=1)
    answers: list[BaseException] = []

    class LostReply:
        async def complete(self, *args: Any, **kwargs: Any) -> bool:
            raise answers.pop(0)

    worker.store = SimpleNamespace(runs=LostReply())  # type: ignore[assignment]
    answers[:] = [RedisUnavailable("reply lost"), StaleAttemptError("s", "r", 1, 1, "completed")]
    assert await worker._complete(intent, 1, result, delivery=1) is True
    answers[:] = [StaleAttemptError("s", "r", 1, 2, "running")]
    assert await worker._complete(intent, 1, result, delivery=1) is False


# ---------------------------------------------------------------- shutdown


async def test_shutdown_drains_an_in_flight_tool(
    hs: Settings, store: Store, bus: Bus
) -> None:
    async with MailboxServer(delay_ms=700) as slow_mail:
        settings = hs.model_copy(update={"mail_url": slow_mail.url})
        session = new_id("s")
        intent = make_intent(bus, session, "send_email",
                             {"to": "f@example.com", "subject": "Notice", "body": "Hello"})
        await commit_runs(store, bus, session, [intent])
        worker = HandsWorker(settings, APP, ["send_email"])
        serving = asyncio.create_task(worker.serve())
        await asyncio.wait_for(worker.ready.wait(), 10)
        await dispatch(bus, intent)
        await eventually(lambda: slow_mail.operations, message="mail accepted, reply held")
        assert worker.inflight == 1
        worker.shutdown()
        await asyncio.wait_for(serving, 15)
        run = await store.runs.get(session, intent.run_id)
        assert run and run.status == "completed" and run.result and run.result.ok
        assert slow_mail.raw_requests == 1
        await settled(bus, "send_email")
