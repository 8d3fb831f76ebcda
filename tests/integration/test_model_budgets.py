"""baton.store.budgets on real Redis (one server and a cluster): a model's fleet-wide budget
(model_limit.lua): concurrent calls, requests and tokens per minute with the usage's
correction, and the provider's pauses. And what configures a budget (baton.budgets).

Timing is read from the script's own answers, on Redis' clock: a wait the script reports
only shrinks while the test runs, so every bound asserted below is an upper bound of a wait,
or a lower bound far above any stall of a loaded machine.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import pytest

from baton.app import App
from baton.brain.budget import Charge, estimate_tokens
from baton.brain.model import ModelRequest
from baton.budgets import ModelBudget, budget_key, parse_budgets
from baton.errors import ConfigError, ValidationError
from baton.models import Entry, Usage
from baton.settings import Settings
from baton.store.budgets import Budgets
from baton.store.keys import Keys
from baton.store.redis_client import connect_redis
from tests.conftest import TOPOLOGIES
from tests.helpers import eventually

#: Long enough that no slot or place lapses while a loaded machine runs a test ...
SLOT_MS = 60_000
#: ... but for the test of a dead holder, whose slot must come back in the test's time.
SHORT_SLOT_MS = 400
_models = itertools.count()


@pytest.fixture
async def budgets(topo_settings: Settings) -> AsyncIterator[Budgets]:
    redis = connect_redis(topo_settings)
    try:
        yield Budgets(redis, Keys(topo_settings.namespace, topo_settings.shards),
                      slot_ms=SLOT_MS)
    finally:
        await redis.aclose()


def model() -> str:
    """A fresh budget key per test (the namespace is the test session's)."""
    return f"openai/gpt-test-{next(_models)}"


def test_budgets_are_read_from_the_setting_and_the_app() -> None:
    assert budget_key("openai:gpt-4o-mini") == "openai/gpt-4o-mini"
    assert budget_key("openai/gpt-4o-mini") == "openai/gpt-4o-mini"
    assert budget_key("my-model") == "my-model"
    parsed = parse_budgets('{"openai:gpt-4o-mini": {"rpm": 500, "tpm": 200000, '
                           '"concurrency": 50}, "anthropic/claude": {}}')
    assert parsed == {"openai/gpt-4o-mini": ModelBudget(rpm=500, tpm=200_000, concurrency=50),
                      "anthropic/claude": ModelBudget()}
    assert ModelBudget.of(parsed["openai/gpt-4o-mini"].as_dict()) == \
        parsed["openai/gpt-4o-mini"]
    assert parsed["anthropic/claude"].describe() == "pauses only"
    for bad in ('{"m/x": {"rpm": -1}}', '{"m/x": {"rpx": 1}}', '{"m/x": 3}', "[1]", "{",
                '{"m{x}": {}}', '{"m/x": {"rpm": 1.5}}', '{"m/x": {"burst_s": "nan"}}'):
        with pytest.raises(ConfigError):
            parse_budgets(bad)
    with pytest.raises(ConfigError, match="BATON_MODEL_BUDGETS"):
        Settings.from_env({"BATON_MODEL_BUDGETS": '{"m/x": {"tpm": -5}}'})
    app = App(model_budgets={"openai:gpt-4o": ModelBudget(rpm=5), "x/y": {"tpm": 9}})
    assert app.model_budgets == {"openai/gpt-4o": ModelBudget(rpm=5), "x/y": ModelBudget(tpm=9)}
    with pytest.raises(ValidationError):
        Keys("t", 1).model_budget("bad*key")


def test_a_call_is_estimated_from_its_prompt_and_its_most_output() -> None:
    request = ModelRequest(model="openai:m", instructions="x" * 400, request_id="t:1:1",
                           entries=(Entry(kind="user", text="y" * 384),))
    assert estimate_tokens(request, 1000) == (400 + 384 + 16) // 4 + 1000
    charge = Charge(estimate=1200)
    assert charge.correction == 0  # no usage reported: the estimate stands
    charge.used(Usage())
    assert charge.correction == 0
    charge.used(Usage(input_tokens=150, output_tokens=50))
    assert charge.correction == -1000


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_concurrent_calls_never_exceed_the_cap(topology: str, budgets: Budgets) -> None:
    m, budget = model(), ModelBudget(concurrency=2)
    assert (await budgets.acquire(m, budget, "a", 0)).granted
    assert (await budgets.acquire(m, budget, "b", 0)).granted
    c = await budgets.acquire(m, budget, "c", 0)
    d = await budgets.acquire(m, budget, "d", 0)
    assert (c.granted, c.position, c.waiting_for) == (False, 1, "slot")
    assert (d.granted, d.position) == (False, 2)
    assert 0 < c.retry_ms <= SLOT_MS
    state = await budgets.look(m, budget)
    assert (state.in_use, state.waiting, state.paused_ms) == (2, 2, 0)
    # d asks again before c: still behind it (its place kept), and nothing more granted
    assert not (await budgets.acquire(m, budget, "d", 0)).granted
    released = await budgets.release(m, budget, "a")
    assert released == type(released)(announce=True, paused_ms=0)
    assert not (await budgets.acquire(m, budget, "d", 0)).granted  # c is first in line
    assert (await budgets.acquire(m, budget, "c", 0)).granted
    assert (await budgets.renew(m, budget, "c"))
    assert not (await budgets.renew(m, budget, "a"))  # released: nothing to renew
    for member in ("b", "c"):
        await budgets.release(m, budget, member)
    assert (await budgets.acquire(m, budget, "d", 0)).granted
    await budgets.release(m, budget, "d")
    assert (await budgets.look(m, budget)).in_use == 0


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_the_slot_of_a_brain_that_died_comes_back(topology: str, budgets: Budgets) -> None:
    short = Budgets(budgets.redis, budgets.keys, slot_ms=SHORT_SLOT_MS)
    m, budget = model(), ModelBudget(concurrency=1)
    assert (await short.acquire(m, budget, "dead", 0)).granted  # never renewed nor released
    first = await short.acquire(m, budget, "next", 0)
    assert not first.granted and first.retry_ms <= SHORT_SLOT_MS

    async def granted() -> bool:
        return (await short.acquire(m, budget, "next", 0)).granted
    await eventually(granted, message="the dead holder's slot back after its time")


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_tokens_per_minute_are_corrected_with_the_reported_usage(
    topology: str, budgets: Budgets,
) -> None:
    # 60 tokens a minute: a token is a second of the rate, and no burst beyond one call.
    m, budget = model(), ModelBudget(tpm=60, burst_s=0)
    assert (await budgets.acquire(m, budget, "a", 30)).granted  # estimated 30 tokens: 30 s
    b = await budgets.acquire(m, budget, "b", 10)
    # b waits for a's 30 s (less what passed): far more than any stall of the test
    assert (b.granted, b.position, b.waiting_for) == (False, 0, "tokens")
    assert 20_000 < b.retry_ms <= 30_000
    # a's call used 5 tokens: the 25 it did not are given back, b waits at most 5 s
    await budgets.release(m, budget, "a", correction=5 - 30)
    b = await budgets.acquire(m, budget, "b", 10)
    assert not b.granted and b.retry_ms <= 5_000
    assert (await budgets.look(m, budget)).tokens_wait_ms <= 5_000
    # giving back more than was taken leaves a full bucket, never a credit beyond it
    await budgets.release(m, budget, "x", correction=-1_000)
    assert (await budgets.acquire(m, budget, "b", 10)).granted  # 10 s of the rate taken
    # b's call used 70 tokens, 60 more than estimated: the rate falls behind by a minute
    await budgets.release(m, budget, "b", correction=70 - 10)
    c = await budgets.acquire(m, budget, "c", 1)
    assert not c.granted and c.waiting_for == "tokens" and 60_000 < c.retry_ms <= 71_000
    await budgets.release(m, budget, "c")


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_requests_per_minute_admit_at_the_rate(topology: str, budgets: Budgets) -> None:
    m, budget = model(), ModelBudget(rpm=2, burst_s=0)  # one call per 30 s
    assert (await budgets.acquire(m, budget, "a", 0)).granted
    b = await budgets.acquire(m, budget, "b", 0)
    assert (b.granted, b.waiting_for) == (False, "requests") and 20_000 < b.retry_ms <= 30_000
    c = await budgets.acquire(m, budget, "c", 0)  # behind b: its guess counts b's turn too
    assert (c.granted, c.position) == (False, 1) and c.retry_ms > b.retry_ms
    for member in ("a", "b", "c"):
        await budgets.release(m, budget, member)
    assert (await budgets.look(m, budget)).waiting == 0


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_a_pause_keeps_the_later_of_those_asked_never_their_sum(
    topology: str, budgets: Budgets,
) -> None:
    m, budget = model(), ModelBudget(concurrency=4)
    assert (await budgets.acquire(m, budget, "a", 0)).granted
    assert (await budgets.acquire(m, budget, "b", 0)).granted
    first = await budgets.release(m, budget, "a", pause_ms=30_000)  # a's 429: Retry-After 30
    assert first.announce is False and 20_000 < first.paused_ms <= 30_000
    second = await budgets.release(m, budget, "b", pause_ms=20_000)  # b's 429, shorter
    assert second.paused_ms <= first.paused_ms  # the later kept: not 50 s, not 20 s
    assert second.paused_ms > 20_000 - (30_000 - first.paused_ms) - 1
    # every call waits it out, in line, though slots are free; told how long
    c = await budgets.acquire(m, budget, "c", 0)
    assert (c.granted, c.position, c.waiting_for) == (False, 1, "paused")
    assert c.retry_ms <= second.paused_ms
    assert (await budgets.look(m, budget)).paused_ms <= c.retry_ms
    # a longer pause asked later moves it on
    third = await budgets.release(m, budget, "x", pause_ms=45_000)
    assert third.paused_ms > 35_000
    await budgets.release(m, budget, "c")


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_a_budget_without_limits_shares_the_providers_pauses_only(
    topology: str, budgets: Budgets,
) -> None:
    m, budget = model(), ModelBudget()
    for member in ("a", "b", "c"):  # no line, no slot, nothing kept
        assert (await budgets.acquire(m, budget, member, 100)).granted
    await budgets.release(m, budget, "a", pause_ms=30_000)
    d = await budgets.acquire(m, budget, "d", 100)
    assert (d.granted, d.waiting_for) == (False, "paused") and d.retry_ms > 20_000
    await budgets.release(m, budget, "d")


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_tenants_with_calls_waiting_take_turns_for_a_models_slot(
    topology: str, budgets: Budgets
) -> None:
    """Tenant a's ten calls wait for the one slot; tenant b's two, arriving after them, are
    served after one of a's each, not after all ten (the line of tool_limit.lua)."""
    key = model()
    budget = ModelBudget(concurrency=1)
    assert (await budgets.acquire(key, budget, "holder", 0, tenant="a")).granted
    waiting = [f"a-{i}" for i in range(10)] + ["b-0", "b-1"]
    for call in waiting:
        assert not (await budgets.acquire(key, budget, call, 0, tenant=call[0])).granted
    served, holder = [], "holder"
    while len(served) < len(waiting):
        await budgets.release(key, budget, holder)
        granted = [m for m in waiting if m not in served
                   and (await budgets.acquire(key, budget, m, 0, tenant=m[0])).granted]
        assert len(granted) == 1, granted
        holder = granted[0]
        served.append(holder)
    assert served.index("b-0") <= 2 and served.index("b-1") <= 4, served
    assert [m for m in served if m[0] == "a"] == [f"a-{i}" for i in range(10)]
