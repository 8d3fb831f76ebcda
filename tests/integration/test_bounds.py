"""The growing structures that needed an enforcer of their bound ("Bounds" in
docs/guides/retention.md), against real Redis and NATS servers: a role's dead letters over
every shard, and the liveness records of workers gone without withdrawing theirs."""

from __future__ import annotations

import pytest

from baton.examples.notices import app
from baton.models import dumps
from baton.settings import Settings
from baton.store.deadletter import (
    MAX_RECORDS,
    PAYLOAD_LIMIT,
    REASON_LIMIT,
    dead_letter_count,
    record_dead_letter,
    shard_cap,
)
from baton.store.keys import LOG_ROLES, Keys
from baton.store.store import Store, now_ms
from baton.store.workers import prune_gone
from tests.helpers import eventually, running, trio
from tests.integration.confinement import Confined

DAY_MS = 86_400_000


async def test_a_role_keeps_its_share_of_dead_letters_on_each_shard(store: Store) -> None:
    """A flood of poison messages about one session lands on one shard's stream: it keeps
    that shard's share of the role's MAX_RECORDS, the newest, however many came."""
    keys, redis = store.keys, store.redis
    cap = shard_cap(keys.shards)
    assert keys.shards == 16 and cap == 625
    for n in range(cap + 50):
        await record_dead_letter(redis, keys, role="brain", source="wake",
                                 reason=f"poison {n}", payload=b"x", session_id="s-flood")
    await record_dead_letter(redis, keys, role="hands", source="hands", reason="other role",
                             payload=b"x", session_id="s-flood")
    stream = keys.dead("s-flood", "brain")
    assert await redis.xlen(stream) == cap
    newest = await redis.xrevrange(stream, count=1)
    oldest = await redis.xrange(stream, count=1)
    assert newest[0][1]["reason"] == f"poison {cap + 49}"
    assert oldest[0][1]["reason"] == "poison 50"
    assert await redis.xlen(keys.dead("s-flood", "hands")) == 1  # each role its own
    assert await dead_letter_count(redis, keys) == cap + 1


@pytest.mark.parametrize("shards", [1, 16, 4096])
def test_a_roles_shares_add_up_to_its_bound(shards: int) -> None:
    assert MAX_RECORDS <= shards * shard_cap(shards) < MAX_RECORDS + shards


async def test_a_full_share_of_the_largest_dead_letters_stays_within_the_stated_bytes(
        store: Store) -> None:
    """The docs state a role's dead letters at about 80 MB (MAX_RECORDS x 8 kB): a full
    share of records with the largest payload and reason takes no more per record."""
    keys, redis = store.keys, store.redis
    cap = shard_cap(keys.shards)
    for _ in range(cap + 10):
        await record_dead_letter(redis, keys, role="relay", source="relay",
                                 reason="r" * (REASON_LIMIT + 100),
                                 payload=b"p" * (PAYLOAD_LIMIT + 100),
                                 row_id="s-big/12/3", subject=f"{keys.ns}.wake.notices.1",
                                 session_id="s-big", stream_id="3:1718000000000-0")
    stream = keys.dead("s-big", "relay")
    assert await redis.xlen(stream) == cap
    per_record = await redis.memory_usage(stream, samples=0) / cap
    assert per_record < 8_000, per_record


def _record(role: str, name: str, seen_ms: int) -> tuple[str, str]:
    field = f"{role}:{name}"
    return field, dumps({"role": role, "name": name, "pid": 1, "seen_ms": seen_ms,
                         "inflight": 0})


async def _seed(redis: object, keys: Keys, records: list[tuple[str, str]]) -> None:
    for field, value in records:
        await redis.hset(keys.workers(field), field, value)  # type: ignore[attr-defined]


async def _fields(redis: object, keys: Keys) -> set[str]:
    out: set[str] = set()
    for key in keys.every("workers"):
        out |= set(await redis.hkeys(key))  # type: ignore[attr-defined]
    return out


async def test_each_role_deletes_the_records_of_its_workers_gone_past_the_keep(
        settings: Settings, store: Store) -> None:
    """Workers killed without withdrawing their records: once a live worker of their role
    runs, the records silent for longer than dead_worker_keep_s go, those gone for less
    stay (inspect shows them as gone), and so do the live workers'."""
    keys, now = store.keys, now_ms()
    old = [_record(role, f"{role}-killed-{n}", now - 2 * DAY_MS - n)
           for role in LOG_ROLES for n in range(3)]
    recent = [_record(role, f"{role}-just-killed", now - 60_000) for role in LOG_ROLES]
    garbage = [("hands:hands-garbled", "{not json")]
    await _seed(store.redis, keys, [*old, *recent, *garbage])
    live = {"relay:relay-1", "hands:hands-1", "brain:brain-1"}
    gone = {f for f, _ in [*old, *garbage]}

    async def pruned() -> bool:
        fields = await _fields(store.redis, keys)
        return live <= fields and not fields & gone

    async with running(*trio(settings, app)):
        await eventually(pruned, timeout=30, message="the records of the gone pruned")
        assert await _fields(store.redis, keys) == live | {f for f, _ in recent}


async def test_each_role_prunes_its_own_records_under_its_acl(confined: Confined) -> None:
    """With the deploy ACL users each role reads every shard's records of its role and
    deletes its gone ones; another role's are left alone."""
    admin = confined.connect("admin")
    keys, now = confined.keys, now_ms()
    try:
        old = [_record(role, f"{role}-killed", now - 2 * DAY_MS) for role in LOG_ROLES]
        await _seed(admin, keys, old)
        for role in LOG_ROLES:
            redis = confined.connect(role)
            try:
                assert await prune_gone(redis, keys, role, now_ms(), DAY_MS) == \
                    [f"{role}:{role}-killed"]
            finally:
                await redis.aclose()
            assert f"{role}:{role}-killed" not in await _fields(admin, keys)
        assert not await _fields(admin, keys)
    finally:
        await admin.aclose()
