"""SIGKILL a Redis Cluster primary during a burst of commits: nothing acknowledged is lost.

Writers submit, take leases and commit on many sessions at once, logging every
acknowledgement they get. Mid-burst the primary serving the most sessions is SIGKILLed; its
replica is promoted (the test waits on the cluster's own state) and the killed node comes
back as its replica (until then the promoted primary, replica-less, refuses writes: the
split-brain guard). Writers that see a write in
doubt or refused take the lease again and go on, as a Brain does. Afterwards every
acknowledged submission and entry is in the store exactly once, and no session's fence went
backwards.

Through the whole stack (Brains, Hands, relays, the mail service, a client): a primary
SIGKILLed mid-run and brought back as a replica; and one lost for good, on the two replicas
per primary that ``baton dev up --cluster`` runs, with more sessions submitted right after.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from redis.crc import key_slot

from baton.client.input import session_for
from baton.devkit.redis_cluster import RedisClusterServers
from baton.errors import LeaseBusyError, StaleFenceError, UnavailableError
from baton.models import Entry, Task
from baton.settings import Settings
from baton.store.store import Store, worker_ref
from baton.store.writes import Writes
from tests.crash.conftest import RECIPIENTS, Opener
from tests.helpers import eventually

pytestmark = pytest.mark.slow

NOTICE_SESSIONS = 6  # five-notice sessions running through the failover
OK_FATES = ("sent", "confirmed after recovery")

SESSIONS = 24  # writers of the burst
COMMITS = 40
WAKE = "fo.wake.notices.1"


@dataclass
class Acks:
    """What writers saw acknowledged: the test's log, checked against the store after."""

    submissions: dict[str, str] = field(default_factory=dict)  # session -> submission id
    entries: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    fences: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    retries: Counter[str] = field(default_factory=Counter)


@pytest.fixture
async def cluster() -> AsyncIterator[RedisClusterServers]:
    async with RedisClusterServers(node_timeout_ms=1_000) as servers:
        yield servers


async def _writer(store: Store, sid: str, acks: Acks, killed: asyncio.Event,
                  started: asyncio.Event) -> None:
    brain = worker_ref("brain", f"brain-{sid}")
    while sid not in acks.submissions:
        try:
            sub, _ = await store.inbox.submit(
                sid, agent="notices", compat=1, wake_subject=WAKE, request_id="r1", text="hi",
                task=Task(id="t1", kind="generation", owner=sid),
                worker=worker_ref("client", "c"), submission_id=f"sub-{sid}")
            acks.submissions[sid] = sub.id
        except UnavailableError:
            acks.retries["submit"] += 1
    n, fence = 0, 0
    while n < COMMITS:
        try:
            text = f"{sid}/{n}"
            if not fence:
                lease, _ = await store.acquire_and_load(sid, brain, 60_000)
                fence = lease.fence
                acks.fences[sid].append(fence)
                # As a Brain does after a takeover: build on what the store holds. A commit
                # that was in doubt may have landed; then it is acknowledged now, not redone.
                if any(e.text == text for e in await store.entries(sid)):
                    acks.entries[sid].append(text)
                    n += 1
                    continue
            await store.commit(sid, fence, Writes(entries=[Entry(kind="model", text=text)]),
                               brain)
            acks.entries[sid].append(text)
            n += 1
            if n == COMMITS // 4:
                started.set()
            if n == COMMITS // 2:
                await killed.wait()  # half the commits land after the failover
        except (UnavailableError, StaleFenceError, LeaseBusyError) as exc:
            acks.retries[type(exc).__name__] += 1
            fence = 0  # in doubt or refused: take the lease again and reload, as a Brain does


async def test_a_primary_killed_mid_burst_loses_no_acknowledged_write(
    cluster: RedisClusterServers,
) -> None:
    settings = Settings(redis_url=cluster.url, namespace="failover", shards=16,
                        redis_in_doubt_retry_ms=15_000)
    store = await Store.connect(settings)
    acks = Acks()
    sids = [f"s{i}" for i in range(SESSIONS)]
    by_port: Counter[int] = Counter()
    for sid in sids:
        by_port[(await cluster.primary_for_key(store.keys.session(sid).meta)).port] += 1
    victim = cluster.node_at(by_port.most_common(1)[0][0])
    killed = asyncio.Event()
    started = [asyncio.Event() for _ in sids]
    try:
        async with asyncio.timeout(120):
            tasks = [asyncio.create_task(_writer(store, sid, acks, killed, ev))
                     for sid, ev in zip(sids, started, strict=True)]
            await asyncio.gather(*(ev.wait() for ev in started))
            cluster.kill(victim)  # mid-burst: scripts in flight on it
            killed.set()
            promoted = await cluster.wait_promoted(victim)
            # The promoted primary has no replica: with min-replicas-to-write 1 it refuses
            # writes (and WAIT cannot be met) until one is back. A worker (re)started now,
            # as in a rolling deploy during the outage, starts all the same: the killed node
            # is seen failed, so the missing replica is an outage, not a configuration (it
            # was refused, 'primary has 0 replicas').
            starting = await Store.connect(settings.model_copy(update={"redis_min_replicas": 1}))
            await starting.close()
            # The killed node rejoins as its replica, as an operator's restart would.
            await cluster.restart(victim)
            await cluster.wait_ready()
            await asyncio.gather(*tasks)
        assert promoted.port != victim.port
        for sid in sids:
            sk = store.keys.session(sid)
            # the acknowledged submission is there: a request waiting in the inbox (no Brain
            # here takes it up)
            assert (await store.inbox.submission(sid, acks.submissions[sid])).id == \
                acks.submissions[sid], sid
            stored = Counter(e.text for e in await store.entries(sid))
            for text in acks.entries[sid]:
                assert stored[text] == 1, (sid, text, stored[text])
            fences = acks.fences[sid]
            assert fences == sorted(set(fences)), (sid, fences)  # never backwards or reused
            assert int(await store.redis.hget(sk.meta, "fence")) >= fences[-1]
        assert sum(len(v) for v in acks.entries.values()) == SESSIONS * COMMITS
    finally:
        await store.close()


async def test_a_primary_killed_mid_run_every_session_settles_with_one_mail_each(
    crash: Opener,
) -> None:
    """The whole stack through a failover: five-notice sessions are running on a Redis
    Cluster when the primary serving most of them is SIGKILLed. Its replica is promoted,
    the killed node comes back as the new primary's replica (until then the split-brain
    guard refuses writes there), and every session completes with each recipient mailed
    exactly once: Brains, Hands, relays and the waiting client ride the failover out."""
    c = await crash(cluster=True, brains=2, hands=2, relays=2)
    redis = c.stack.clusters.redis  # type: ignore[union-attr]
    await c.http.post("/hold")  # sends are recorded, their answers wait for the release
    subs = [await c.submit() for _ in range(NOTICE_SESSIONS)]
    by_port = Counter([(await redis.primary_for_key(c.store.keys.session(s.session_id).meta)).port
                       for s in subs])
    victim = next(n for n in redis.nodes if n.port == by_port.most_common(1)[0][0])

    async def mailing() -> bool:  # runs are in flight: the kill lands mid-run
        return int((await c.stats())["held"]) >= 1

    await eventually(mailing, timeout=60, message="a first send held")
    redis.kill(victim)
    await c.http.post("/release")  # the held sends answer while the slots fail over
    await redis.wait_promoted(victim, timeout=60)
    await redis.restart(victim)  # back as the replica of the promoted node
    finals = [await c.settle(s, timeout=180) for s in subs]
    for final in finals:
        # A send whose completion was in doubt when the slots moved is re-claimed and confirmed
        # with the mail service, never sent again: either fate is one mail.
        fates = {to: fate for to in RECIPIENTS for fate in OK_FATES
                 if f"{to}: {fate}" in (final.answer or "")}
        assert sorted(fates) == sorted(RECIPIENTS), final.answer
        await c.check_completed(final, fates)
    stats = await c.stats()
    assert stats["deliveries"] == {r: NOTICE_SESSIONS for r in RECIPIENTS}, stats
    assert stats["accepted"] == NOTICE_SESSIONS * len(RECIPIENTS), stats


async def test_a_primary_lost_for_good_stops_no_session_before_or_after(crash: Opener) -> None:
    """A host lost for good: five-notice sessions are running when the primary serving most
    of them is SIGKILLed and never restarted, and more sessions are submitted right after,
    half of them to its slots, before the cluster has promoted anyone.

    With two replicas per primary (what ``baton dev up --cluster`` runs) the promoted replica
    keeps one, so the split-brain guard (min-replicas-to-write 1) goes on taking its writes;
    the client's writes wait the failover out. Every session, before and after, completes,
    and each recipient is mailed exactly once per session. (With one replica per primary the
    promoted one refused every write with NOREPLICAS for good: a third of the sessions
    stopped, and submits to its slots failed.)"""
    c = await crash(cluster=True, brains=2, hands=2, relays=2)
    redis = c.stack.clusters.redis  # type: ignore[union-attr]
    await c.http.post("/hold")  # sends are recorded, their answers wait for the release
    before = [await c.submit() for _ in range(NOTICE_SESSIONS)]
    by_port = Counter([(await redis.primary_for_key(c.store.keys.session(s.session_id).meta)).port
                       for s in before])
    victim = redis.node_at(by_port.most_common(1)[0][0])
    lost = next(i for i in await redis.topology() if i.port == victim.port)
    # Request ids whose sessions live on the victim's slots (half of the later ones), and
    # others, chosen now: the later submits go out at once after the kill.
    on_victim: list[str] = []
    elsewhere: list[str] = []
    n = 0
    while len(on_victim) < NOTICE_SESSIONS // 2 or len(elsewhere) < NOTICE_SESSIONS // 2:
        rid = f"after-{n}"
        n += 1
        slot = key_slot(c.store.keys.session(session_for(None, rid)).meta.encode())
        (on_victim if lost.serves(slot) else elsewhere).append(rid)
    later = on_victim[:NOTICE_SESSIONS // 2] + elsewhere[:NOTICE_SESSIONS // 2]

    async def mailing() -> bool:  # runs are in flight: the kill lands mid-run
        return int((await c.stats())["held"]) >= 1

    await eventually(mailing, timeout=60, message="a first send held")
    redis.kill(victim)  # for good: the host is gone
    # Watched from now: once the failover is done the lost node serves no slot to look for.
    promoting = asyncio.create_task(redis.wait_promoted(victim, timeout=60))
    await c.http.post("/release")  # the held sends answer while the slots fail over
    after = [await c.submit(request_id=rid) for rid in later]
    promoted = await promoting
    assert promoted.port != victim.port and not victim.running
    finals = [await c.settle(s, timeout=180) for s in [*before, *after]]
    for final in finals:
        # A send in doubt when the slots moved is re-claimed and confirmed with the mail
        # service, never sent again: either fate is one mail.
        fates = {to: fate for to in RECIPIENTS for fate in OK_FATES
                 if f"{to}: {fate}" in (final.answer or "")}
        assert sorted(fates) == sorted(RECIPIENTS), final.answer
        await c.check_completed(final, fates)
    total = len(before) + len(after)
    stats = await c.stats()
    assert stats["deliveries"] == {r: total for r in RECIPIENTS}, stats
    assert stats["accepted"] == total * len(RECIPIENTS), stats
