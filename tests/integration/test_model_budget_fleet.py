"""A model's fleet-wide budget with two Brains on real Redis, NATS and an HTTP model server
(tests.model_server, which counts the requests in flight and stamps each with its own
clock): the cap on concurrent calls holds across both Brains, and a 429 with
``Retry-After: 2`` pauses the whole fleet's calls of that model for those 2 s, once, then
they resume and every session completes.

The model server's hold (every request is recorded and waits for the release) stops the
fleet at a known point instead of racing a delay: with every slot taken and nothing
answered, exactly the cap's calls are in, whatever the machine's load.
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from baton.brain.worker import BrainWorker
from baton.budgets import ModelBudget
from baton.cli.inspect import cluster_view, render_cluster
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.hands.worker import HandsWorker
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.budgets import Budgets
from tests.helpers import eventually, running
from tests.integration.model_runs import model_settings
from tests.model_apps import OPENAI_MODEL, openai_app
from tests.model_server import Behaviour, ModelServer

pytestmark = pytest.mark.slow

BUDGET = OPENAI_MODEL.replace(":", "/", 1)  # "openai-compatible/test-model"
SESSIONS = 6
RETRY_AFTER_S = 2


def notice(n: int) -> str:
    return f"Send the approved notice to c{n}@example.com, then summarise."


def fleet(settings: Settings, server: ModelServer, mailbox: MailboxServer,
          budget: ModelBudget) -> tuple[Settings, list[object]]:
    """Settings with the model's budget, and a relay, a Hands and two Brains of them."""
    s = model_settings(settings, server, mail_url=mailbox.url,
                       model_budgets=json.dumps({BUDGET: budget.as_dict()}))

    def named(name: str) -> Settings:
        return s.model_copy(update={"worker_name": name})

    return s, [Relay(named("relay-1")), HandsWorker(named("hands-1"), openai_app),
               BrainWorker(named("brain-1"), openai_app),
               BrainWorker(named("brain-2"), openai_app)]


async def test_two_brains_never_put_more_than_the_cap_on_the_model(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer,
) -> None:
    budget = ModelBudget(concurrency=2)
    s, services = fleet(settings, model_server, mailbox, budget)
    async with running(*services):
        client = await Client.connect(s)
        try:
            budgets = Budgets(client.store.redis, client.store.keys, slot_ms=1)
            model_server.hold()
            subs = [(await client.submit(notice(n), agent="notices"))[0]
                    for n in range(SESSIONS)]

            async def queued() -> bool:
                state = await budgets.look(BUDGET, budget)
                # the cap's calls at the server, the other sessions' calls in line in Redis
                return (model_server.waiting, state.in_use, state.waiting) == \
                    (2, 2, SESSIONS - 2)
            await eventually(queued, timeout=60, message="the cap's calls held, the rest queued")
            assert model_server.max_in_flight == 2
            # What an operator sees: the Brains announce the budget, inspect reads its keys.
            view = await cluster_view(client.store)
            assert view["model_budgets"] == [{
                "model": BUDGET, "budget": "2 at once", **budget.as_dict(), "in_use": 2,
                "waiting": SESSIONS - 2, "paused_ms": 0, "requests_wait_ms": 0,
                "tokens_wait_ms": 0, "in_use_by_tenant": {"default": 2},
                "waiting_by_tenant": {"default": SESSIONS - 2}}]
            out = io.StringIO()
            render_cluster(view, Console(file=out, width=200, color_system=None))
            assert "Fleet-wide model budgets" in out.getvalue() and "2 of 2" in out.getvalue()
            model_server.release()
            finals = [await client.wait(sub, timeout=120) for sub in subs]
            assert {f.status for f in finals} == {"completed"}
            state = await budgets.look(BUDGET, budget)
        finally:
            await client.close()
    assert (state.in_use, state.waiting) == (0, 0)  # every slot and place given back
    assert model_server.max_in_flight == 2
    assert len(model_server.requests) == SESSIONS * 2  # a call with the tool, a summary


async def test_a_429_pauses_the_whole_fleet_for_its_retry_after_once(
    settings: Settings, mailbox: MailboxServer, model_server: ModelServer,
) -> None:
    budget = ModelBudget(concurrency=3)
    s, services = fleet(settings, model_server, mailbox, budget)
    async with running(*services):
        client = await Client.connect(s)
        try:
            budgets = Budgets(client.store.redis, client.store.keys, slot_ms=1)
            model_server.hold()
            subs = [(await client.submit(notice(n), agent="notices"))[0]
                    for n in range(SESSIONS)]

            async def queued() -> bool:
                state = await budgets.look(BUDGET, budget)
                return (model_server.waiting, state.in_use, state.waiting) == \
                    (3, 3, SESSIONS - 3)
            await eventually(queued, timeout=60, message="the cap's calls held, the rest queued")
            # The provider's limit: each call in flight is answered 429, Retry-After: 2.
            model_server.script(*[Behaviour(status=429, retry_after=RETRY_AFTER_S)] * 3)
            model_server.release()
            finals = [await client.wait(sub, timeout=120) for sub in subs]
            assert {f.status for f in finals} == {"completed"}
        finally:
            await client.close()
    refused = [r for r in model_server.requests if r.refused_at is not None]
    assert len(refused) == 3  # the calls in flight then, and no other: none met the pause
    first = min(r.refused_at for r in refused if r.refused_at is not None)
    after = [r.at for r in model_server.requests if r.at > first]
    # Nothing reached the server within Retry-After of its first 429, on its own clock (the
    # pause is kept on Redis' clock, the same host's, read in whole ms: 2 ms of rounding).
    assert after and min(after) >= first + RETRY_AFTER_S - 0.002, (first, sorted(after)[:3])
    # Then the fleet resumed: every session's two calls answered, the refused ones again.
    assert len(model_server.requests) == SESSIONS * 2 + 3
