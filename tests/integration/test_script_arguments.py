"""Every script refuses a hostile numeric argument before its first write (_args.lua).

Each script is called, against a real Redis holding a session mid-life (a request taken up,
a tool run dispatched, a relay lease, timers, receipts), once per numeric argument and
hostile value: ``nan``, ``inf``, fractions, negatives, values past the argument's range,
empty and non-numeric text. Each call must be refused with INVALID and leave every key of
the namespace as it was (``DUMP`` and ``PEXPIRETIME`` of each key before and after). Before
these checks a lease TTL was used after the acquire's receipt and fence increment, a renewal
stored a ``nan`` TTL that later quarantined the session, a batched claim with a bad ttl
failed after the first run's writes, and a relay's bad limit reached ZRANGE after others.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from redis.exceptions import ResponseError

from baton.models import ToolIntent
from baton.store.outbox import Outbox
from baton.store.scripts import (
    LIMIT_SCRIPTS,
    SESSION_SCRIPTS,
    SHARD_SCRIPTS,
    TOMBSTONE_SCRIPTS,
    declared,
)
from baton.store.store import Store, worker_ref
from baton.store.writes import Writes, timer_member
from tests.helpers import take_up

SID = "s-hostile"
BRAIN = worker_ref("brain", "brain-h")
WJ = BRAIN.model_dump_json()
HJ = worker_ref("hands", "hands-h").model_dump_json()
WAKE = "t.wake.notices.1"
MS, INT = 100_000_000_000, 9_007_199_254_740_991

HOSTILE = ["nan", "NaN", "inf", "-inf", "1.5", "0.5", "-1", "-2", "0", "1e400", "1e300",
           "9007199254740993", "", "x", "1x"]


def hostile_for(lo: int, hi: int) -> list[str]:
    """The values of HOSTILE outside [lo, hi] as integers (those a script must refuse)."""
    out = []
    for v in HOSTILE:
        try:
            n = float(v)
        except ValueError:
            out.append(v)
            continue
        if not math.isfinite(n) or n != int(n) or not lo <= n <= hi:
            out.append(v)
    return out


@dataclass
class Case:
    script: str
    args: list[str]  # valid arguments (ARGV without the commit id)
    numeric: dict[int, tuple[str, int, int]]  # 1-based ARGV position -> (name, lo, hi)
    keys: Callable[[Store], list[str]] | None = None  # shard scripts: their KEYS


def shard_keys(*names: str) -> Callable[[Store], list[str]]:
    def keys(store: Store) -> list[str]:
        shard = store.keys.shard_of(SID)
        k = store.keys
        table = {"timers": k.timers(shard), "outbox": k.outbox(shard),
                 "lease": k.relay_lease(shard), "sessions": k.sessions(shard),
                 "requested": k.requested(shard), "poison": k.session(SID).poison,
                 **dict(zip(("adm", "adm_info", "adm_fly", "adm_q"), k.admission(shard),
                            strict=True))}
        return [table[n] for n in names]
    return keys


def prefix(store: Store) -> str:
    return store.keys.session(SID).meta.removesuffix(f"{SID}:meta")


CASES = [
    Case("acquire", ["brain-h", "5000", WJ, "", "10", "0", "0"],
         {2: ("lease ttl ms", 1, MS), 5: ("entries page", -1, INT),
          6: ("entries held", 0, INT)}),
    Case("renew", ["1", "5000", WJ], {1: ("fence", 0, INT), 2: ("lease ttl ms", 1, MS)}),
    Case("release", ["1", "5000", "", "", "1"],
         {1: ("fence", 0, INT), 2: ("lease ttl ms", 1, MS), 5: ("handover", 0, 1)}),
    Case("heartbeat", ["r-1", "1", WJ], {2: ("attempt", 0, INT)}),
    Case("slot_wait", ["r-1", "send_email", HJ, "waiting", "2", "0"],
         {5: ("place in line", 0, INT), 6: ("ms waited", 0, MS)}),
    Case("partial", ["1", WJ, "task-r1", "r1", "0", "text", "{}"],
         {1: ("fence", 0, INT), 5: ("offset", 0, INT)}),
    Case("commit", ["1", WJ, SID, '{"k":"commit"}'], {1: ("fence", 0, INT)}),
    Case("claim", ["hands-h", "5000", WJ, "r-1", "1", "", "", ""],
         {2: ("attempt ttl ms", 1, MS), 5: ("delivery count", 0, INT)}),
    Case("complete", [WJ, SID, "r-1", "1", '{"outcome": "ok"}', "", "0", "{}", "{}", "{}"],
         {4: ("attempt", 0, INT)}),
    Case("submit", [SID, "notices", "1", WAKE, "r9", "sub-r9", "{}", "{}", "t9", "{}", "{}",
                    WJ, "{}", "{}", "", "", "4", "acme", "3", "2"],
         {3: ("compat level", 0, INT), 17: ("admission window", 0, INT),
          19: ("priority", 1, 5), 20: ("weight", 1, 100)}),
    Case("start", [SID, "notices", "1", WAKE, "r9", "t9", "{}", "{}", WJ, "{}", "{}", "",
                   "4", "acme", "3", "2"],
         {3: ("compat level", 0, INT), 13: ("admission window", 0, INT),
          15: ("priority", 1, 5), 16: ("weight", 1, 100)}),
    Case("archive", ["1", "brain-h", SID, "1", "", "obj", "60000", "completed", "1", "60000"],
         {1: ("fence", 0, INT), 4: ("meta seq", 0, INT), 7: ("tombstone ttl ms", 1, MS),
          9: ("submissions", 0, INT), 10: ("archived index ms", 1, MS)}),
    Case("reinstate", ["1", "1", "1", "notices", "1", WAKE, "1", "completed", "1", "60000"],
         {1: ("archival ms", 0, MS * 100), 2: ("fence", 0, INT), 3: ("meta seq", 0, INT),
          10: ("tombstone ttl ms", 1, MS)}),
    Case("poison", [SID, "a failure", "3"], {3: ("failure limit", 1, INT)},
         shard_keys("poison", "timers")),
    Case("fire_timers", ["100", "1000", "<prefix>", "relay-h", "1"],
         {1: ("max timers", 1, 100_000), 2: ("re-arm interval ms", 1, MS),
          5: ("fence", 0, INT)}, shard_keys("timers", "outbox", "lease")),
    Case("arm_requests", ["relay-h", "1", "<prefix>", "15000", SID],
         {2: ("fence", 0, INT), 4: ("progress deadline ms", 1, MS)},
         shard_keys("timers", "lease", "sessions", "requested", "adm_q")),
    Case("admitted", [SID, "4", "30000"],
         {2: ("admission window", 1, INT), 3: ("start ms", 1, MS)},
         shard_keys("adm", "adm_info", "adm_fly", "adm_q", "outbox")),
    Case("relay_lease", ["acquire", "relay-h", "5000"], {3: ("lease time ms", 1, MS)},
         shard_keys("lease")),
    Case("relay_lease", ["renew", "relay-h", "5000", "1"],
         {3: ("lease time ms", 1, MS), 4: ("fence", 0, INT)}, shard_keys("lease")),
    Case("relay_lease", ["release", "relay-h", "5000", "1"],
         {3: ("lease time ms", 1, MS), 4: ("fence", 0, INT)}, shard_keys("lease")),
    Case("relay_ack", ["relay-h", "1", "0-1"], {2: ("fence", 0, INT)},
         shard_keys("lease", "outbox")),
    Case("tool_limit", ["acquire", "run-1", "3", "400", "50", "2", "acme", "3"],
         {3: ("cap", 0, INT), 4: ("slot time ms", 1, MS), 5: ("rate interval ms", 0, MS),
          6: ("burst", 1, INT), 8: ("weight", 1, 100)},
         lambda store: store.keys.tool_limit("mail")),
    # a model's budget: every argument checked before the first write, at acquire (the
    # estimate, 0 or more) as at release (the usage's correction, signed; the pause)
    *(Case("model_limit", [op, "call-1", "3", "400", "500", "200000", "1000", tokens, "0",
                           "acme", "2"],
           {3: ("cap", 0, INT), 4: ("slot time ms", 1, MS),
            5: ("requests per minute", 0, INT), 6: ("tokens per minute", 0, INT),
            7: ("burst ms", 0, MS), 8: ("tokens", low, INT), 9: ("pause ms", 0, MS),
            11: ("weight", 1, 100)},
           lambda store: store.keys.model_budget("openai/gpt-4o-mini"))
      for op, tokens, low in (("acquire", "1200", 0), ("release", "-300", -INT))),
]


def test_every_script_with_numeric_arguments_is_covered() -> None:
    """A script added later is listed here, or this fails: each one is driven below."""
    without = {"cancel", "approve", "restore", "ask_restore"}  # no numeric argument
    assert {c.script for c in CASES} | without == set(
        SESSION_SCRIPTS + SHARD_SCRIPTS + TOMBSTONE_SCRIPTS + LIMIT_SCRIPTS)


async def _snapshot(store: Store) -> dict[str, tuple[Any, int]]:
    """Every key of the test's namespace: its value (DUMP) and when it expires (PEXPIRETIME:
    an absolute time, so a key's TTL running down between two snapshots is no change)."""
    redis = store.redis
    out = {}
    async for key in redis.scan_iter(match=f"{store.keys.ns}:*", count=1000):
        out[key] = (await redis.dump(key), await redis.pexpiretime(key))
    return out


async def _session_mid_life(store: Store) -> None:
    """A session with a request taken up, a tool run dispatched, a lease and a deadline;
    a relay lease, a timer and outbox rows on its shard."""
    from tests.integration.test_store import submit

    await submit(store, SID, take=False)
    await take_up(store, SID, BRAIN)
    lease = await store.acquire(SID, BRAIN, 60_000)
    run = ToolIntent(run_id="r-1", session_id=SID, task_id="task-r1", tool="send_email",
                     arguments={"to": "a@example.com"}, replay="safe",
                     operation_id="op-r-1", wake_subject=WAKE)
    await store.commit(SID, lease.fence, Writes(
        runs=[run], deadline_ms=60_000,
        timers_add={timer_member("task", SID, "task-r1", WAKE): 1}), BRAIN)
    box = Outbox(store.redis, store.keys)
    await box.lease("acquire", store.keys.shard_of(SID), "relay-h", 60_000)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.script}-{c.args[0]}"
                         if c.script in ("relay_lease", "model_limit") else c.script)
async def test_a_hostile_number_is_refused_with_nothing_written(store: Store,
                                                               case: Case) -> None:
    await _session_mid_life(store)
    script = getattr(store.scripts.registered, case.script)
    if case.keys is not None:
        keys = case.keys(store)
        base = [prefix(store) if a == "<prefix>" else a for a in case.args]
    else:
        keys = declared(case.script, store.keys.session(SID))
        base = ["", *case.args] if case.script in SESSION_SCRIPTS else list(case.args)
    shift = len(base) - len(case.args)  # the commit id before a session script's ARGV
    tried = 0
    for pos, (name, lo, hi) in case.numeric.items():
        for value in hostile_for(lo, hi):
            args = list(base)
            args[pos - 1 + shift] = value
            before = await _snapshot(store)
            with pytest.raises(ResponseError) as refused:
                await script(keys=keys, args=args)
            assert str(refused.value).startswith(f"INVALID {name} must be an integer"), (
                case.script, name, value, str(refused.value))
            assert await _snapshot(store) == before, (case.script, name, value)
            tried += 1
    assert tried >= len(case.numeric) * 8
