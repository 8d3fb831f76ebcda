"""Fair admission of new sessions (baton.store.admission) on real Redis and NATS servers.

A tenant's burst waits in Redis, not in front of everyone in JetStream: tenant B's few
sessions, submitted after tenant A's 500, finish while most of A's still wait. Priorities
go before fairness. Past a bound on waiting work a submission is refused (the client's
BacklogFullError, the API's 429 with Retry-After) with nothing written.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from rich.console import Console

from baton.api.auth import Tokens
from baton.brain.worker import BrainWorker
from baton.cli.inspect import cluster_view, render_cluster
from baton.client import Client
from baton.client.input import session_for
from baton.errors import BacklogFullError
from baton.examples.notices import app
from baton.models import Submission
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.admission import AdmissionQueue
from tests.api_helpers import auth, problem, serving_api
from tests.conftest import TOPOLOGIES
from tests.helpers import eventually, running

TEXT = "Say hello."  # no address: the scripted model answers at once, no tool runs


def admitting(settings: Settings, **more: object) -> Settings:
    return settings.model_copy(update={"admission_window": 8, **more})


async def _settled_before(client: Client, subs: list[Submission],
                          others: list[Submission]) -> int:
    """How many of ``subs`` had settled before the last of ``others`` did, on the system's
    own clock: each submission's ``settled_ms``, stamped on Redis' clock by the Brain that
    ended it (not when this client, slowed by a loaded machine, heard of it)."""
    async def ended(s: Submission) -> int:
        state = await client.store.inbox.submission(s.session_id, s.id)
        assert state.settled and state.settled_ms is not None, state
        return state.settled_ms
    last = max(await asyncio.gather(*(ended(s) for s in others)))
    return sum(1 for at in await asyncio.gather(*(ended(s) for s in subs)) if at < last)


async def _submit(client: Client, n: int, tenant: str, priority: int = 3) -> list[Submission]:
    subs = []
    for i in range(0, n, 50):
        batch = await asyncio.gather(*(client.submit(TEXT, agent="notices", tenant=tenant,
                                                     priority=priority)
                                       for _ in range(min(50, n - i))))
        subs += [s for s, created in batch if created]
    return subs


async def test_a_tenant_behind_a_burst_finishes_before_the_burst_drains(
    settings: Settings,
) -> None:
    settings = admitting(settings)
    client = await Client.connect(settings)
    client.warn_unserved = False
    try:
        # No Brain yet: tenant A's burst and then B's five all wait to start.
        burst = await _submit(client, 500, "a")
        late = await _submit(client, 5, "b")
        backlog = await client.admission.backlog()
        assert backlog.tenants == {"a": 500, "b": 5}, backlog
        assert backlog.starting <= settings.admission_window + settings.shards, backlog

        # The Brain is not told the window: the one the submissions gave the shards counts.
        brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1",
                                                        "admission_window": 0}), app)
        relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
        async with running(relay, brain):
            done = await asyncio.gather(*(client.wait(s, timeout=120) for s in late))
            assert all(s.status == "completed" for s in done), done
            for s in burst:
                await client.wait(s, timeout=300)
        # When B's five had finished, most of A's burst had not.
        finished_a = await _settled_before(client, burst, late)
        assert finished_a < 250, (
            f"{finished_a} of tenant a's 500 sessions had finished when tenant b's 5 had: "
            "b waited behind a's burst")
        assert (await client.admission.backlog()).waiting == 0
        # Each session keeps its tenant (its meta: Hands share capped tools' slots by it).
        keys = client.store.keys
        assert {await client.store.redis.hget(keys.session(s.session_id).meta, "tenant")
                for s in (burst[0], late[0])} == {"a", "b"}
    finally:
        await client.close()


# Known open (issue 47): under a loaded CI run this test twice saw the urgent sessions end
# after every low one, or not within the suite's timeout. Only a Brain receiving a new
# session's first wake calls admitted.lua, the one place admission_start_ms frees a place
# whose wake or receipt was lost; with a window of 1 nothing else moves the line. Until a
# periodic sweep exists, a failure here is that bug, not a new one.
@pytest.mark.xfail(strict=False, reason="admission line can stall under load (issue 47)")
@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_priority_goes_before_arrival_and_tenant(topology: str,
                                                       topo_settings: Settings) -> None:
    settings = admitting(topo_settings, admission_window=1, shards=1)
    client = await Client.connect(settings)
    client.warn_unserved = False
    try:
        low = await _submit(client, 30, "a", priority=5)
        urgent = await _submit(client, 3, "a", priority=1)
        # A wait that ends before its turn says what it waits for.
        queue = client.store.keys.admission(0)[3]
        queued = [s for s in low if await client.store.redis.zscore(queue, s.session_id)]
        with pytest.raises(TimeoutError, match=r"admission queue \(\d+ before it\)"):
            await client.wait(queued[-1], timeout=0.1)
        # One session at a time: the Brain ends them in the order admission let them start.
        brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1",
                                                        "brain_concurrency": 1}), app)
        relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
        # Under the suite's timeout, so a stall ends here and the services stop cleanly.
        async with running(relay, brain), asyncio.timeout(90):
            for s in (*urgent, *low):
                await client.wait(s, timeout=90)
        # One session starts at a time on the one shard: the first low one was let through
        # at once (nothing waited), the urgent ones next, before the other 29.
        finished_low = await _settled_before(client, low, urgent)
        assert finished_low < 15, finished_low
    finally:
        await client.close()


async def test_past_the_bound_the_client_and_api_refuse_with_nothing_written(
    settings: Settings,
) -> None:
    settings = admitting(settings, max_waiting_per_tenant=3, max_waiting=5,
                         admission_retry_after_s=2.0, admission_window=1, shards=1)
    client = await Client.connect(settings)
    client.warn_unserved = False
    try:
        first_three = await _submit(client, 3, "a")
        with pytest.raises(BacklogFullError) as refused:
            await client.submit(TEXT, agent="notices", tenant="a", request_id="a-4th")
        assert refused.value.retryable and refused.value.bound == "tenant"
        assert refused.value.waiting == 3 and refused.value.limit == 3
        # Nothing of the refused submission was written.
        assert not await client.store.inbox.exists(session_for(None, "a-4th"))
        # A new session the caller names counts too; one Redis holds already does not.
        with pytest.raises(BacklogFullError):
            await client.submit(TEXT, agent="notices", tenant="a", session_id="s-named-new")
        # More input to a session waiting for its turn passes, and does not start it early.
        queue = client.store.keys.admission(0)[3]
        in_line = [s.session_id for s in first_three
                   if await client.store.redis.zscore(queue, s.session_id) is not None]
        waiting_sid = in_line[0]
        wakes = client.store.keys.wakes(0)
        rows = await client.store.redis.xlen(wakes)
        _, more = await client.submit("And more.", agent="notices", tenant="a",
                                      session_id=waiting_sid)
        assert more and await client.store.redis.xlen(wakes) == rows
        assert (await client.admission.backlog()).tenants == {"a": 3}

        await _submit(client, 2, "b")  # another tenant is within its own bound
        tokens = Tokens(Tokens.parse("read:r-token-0123456789,operate:o-token-0123456789",
                                     "test"))
        async with serving_api(settings, tokens) as base, httpx.AsyncClient() as http:
            r = await http.post(f"{base}/v1/submissions", headers=auth("o-token-0123456789"),
                                json={"text": TEXT, "agent": "notices", "tenant": "c"})
            body = problem(r, 429, "backlog_full")
            assert r.headers["Retry-After"] == "2", r.headers
            assert body["retryable"] and body["bound"] == "total" and body["limit"] == 5
            seen = (await http.get(f"{base}/v1/admission",
                                   headers=auth("r-token-0123456789"))).json()
        assert seen["waiting"] == 5 and seen["max_waiting"] == 5, seen
        assert {t["tenant"]: t["waiting"] for t in seen["tenants"]} == {"a": 3, "b": 2}
        # and the fleet-wide limits live services announce (none here: no Hands, no Brain)
        assert seen["tool_limits"] == [] and seen["model_budgets"] == [], seen
        # baton inspect's cluster view says the same.
        console = Console(width=200, record=True)
        render_cluster(await cluster_view(client.store), console)
        shown = console.export_text()
        assert "New sessions waiting to start: 5" in shown, shown
        assert "in total 5, per tenant 3" in shown, shown

        # Once Brains take sessions up, the backlog drains and submissions pass again.
        brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app)
        relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
        async with running(relay, brain):
            queue = AdmissionQueue(client.store.redis, client.store.keys, settings)

            async def drained() -> bool:
                return (await queue.backlog()).waiting == 0

            await eventually(drained, timeout=60, message="the backlog drains")
            client._gate.forget()
            sub, created = await client.submit(TEXT, agent="notices", tenant="a")
            assert created
            assert (await client.wait(sub, timeout=60)).status == "completed"
    finally:
        await client.close()


async def test_a_started_task_opening_a_session_is_admitted_too(settings: Settings) -> None:
    """A root task started in a new session waits its turn like a submission, and its
    session keeps its tenant."""
    from tests.task_apps import only_tasks

    settings = admitting(settings, admission_window=1, shards=1)
    client = await Client.connect(settings)
    client.warn_unserved = False
    try:
        started = [await client.start_task(None, "leaf", {"fail": True}, agent="batch",
                                           tenant="t1", priority=2) for _ in range(4)]
        backlog = await client.admission.backlog()
        assert (backlog.tenants, backlog.starting, backlog.queued) == ({"t1": 4}, 1, 3)
        brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}),
                            only_tasks)
        relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
        async with running(relay, brain):
            ended = [await client.wait_task(sid, tid, timeout=60) for sid, tid, _ in started]
        assert all(getattr(t.state, "outcome", None) == "failed" for t in ended), ended
        assert (await client.admission.backlog()).waiting == 0
        meta = client.store.keys.session(started[0][0]).meta
        assert await client.store.redis.hget(meta, "tenant") == "t1"
    finally:
        await client.close()
