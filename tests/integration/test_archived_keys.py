"""An archived session read as Redis would answer (baton.archive.ArchivedKeys): every read
command a reader sends for a session's keys gives the same reply from a real Redis holding
the keys and from the view of their snapshot, on empty, missing and other sessions' keys
too; and a real five-notice session, snapshot, archived and loaded back, reads the same."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import DataError, ResponseError

from baton.archive import Archive, ArchivedError, ArchivedKeys, decode, encode, snapshot
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.examples.notices import app
from baton.settings import Settings
from baton.store.keys import SessionKeys
from baton.store.loading import queue_load
from baton.store.store import Store
from tests.helpers import running, trio

LONG = "x" * 100  # past hash-max-listpack-value: Redis keeps the hash as a hash table


async def fill(redis: Any, sk: SessionKeys) -> None:
    """A session's keys as a settled session has them, some families empty."""
    await redis.hset(sk.meta, mapping={"agent": "notices", "compat": "1", "seq": "7",
                                       "fence": "3", "holder": "", "created": "1000"})
    await redis.rpush(sk.entries, *[f'{{"i":{i},"text":"entry {i}"}}' for i in range(7)])
    await redis.hset(sk.tasks, mapping={"t-1": '{"id":"t-1"}'})
    await redis.hset(sk.done, mapping={f"t-{i}": f'{{"id":"t-{i}","pad":"{LONG}"}}'
                                       for i in range(2, 6)})
    await redis.hset(sk.docs, mapping={"plan": "head", "plan@b": "", "plan@1": "delta"})
    await redis.hset(sk.subs, mapping={
        "sub-1": '{"id":"sub-1","agent":"notices","status":"completed","created_ms":1000,'
                 '"settled_ms":1500}',
        "sub-2": '{"id":"sub-2","agent":"notices","status":"failed","created_ms":2000,'
                 '"settled_ms":2600}'})
    await redis.hset(sk.reqs, mapping={"r-1": "sub-1", "r-2": "sub-2"})
    await redis.hset(sk.runs, mapping={"run-1.status": "completed", "grp:g": "1"})
    await redis.hset(sk.runs_done, mapping={"run-0.result": LONG, "run-0.attempt": "1"})
    await redis.hset(sk.intents, mapping={"gc": "run-0 grp:g"})
    # inbox and poison: empty, so missing
    for ms, n in ((1000, 3), (1001, 1), (2000, 2)):
        for seq in range(n):
            await redis.xadd(sk.receipts, {"seq": str(seq), "kind": "commit", "ts": str(ms)},
                             id=f"{ms}-{seq}")
    await redis.set(sk.nudge, "1")
    await redis.hset(sk.applied, mapping={"c-1": "ok"})  # not archived: reads as missing


def reads(sk: SessionKeys, others: list[str]) -> list[tuple[str, tuple[Any, ...],
                                                            dict[str, Any]]]:
    """Read commands over the session's keys and ``others`` (keys the view reads as
    missing: of another session, of the shard)."""
    hashes = [sk.meta, sk.tasks, sk.done, sk.docs, sk.subs, sk.reqs, sk.runs, sk.runs_done,
              sk.intents, sk.inbox, sk.poison, sk.applied, *others]
    lists = [sk.entries, *others]
    streams = [sk.receipts, *others]
    every = [*hashes, sk.entries, sk.receipts, sk.nudge]
    out: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def add(name: str, *args: Any, **kwargs: Any) -> None:
        out.append((name, args, kwargs))

    for key in hashes:
        add("hgetall", key)
        add("hkeys", key)
        add("hvals", key)
        add("hlen", key)
        for field in ("agent", "t-3", "sub-2", "r-1", "plan@1", "gc", "missing"):
            add("hget", key, field)
            add("hexists", key, field)
        add("hmget", key, ["agent", "missing", "t-1", "sub-1"])
        add("hmget", key, "seq", "fence", "created")
    for key in lists:
        add("llen", key)
        for start, end in ((0, -1), (-3, -1), (2, 4), (4, 2), (0, 0), (-1, -1), (6, 100),
                           (7, 10), (-100, 2), (-100, -50), (3, -3), (0, -100)):
            add("lrange", key, start, end)
    for key in streams:
        add("xlen", key)
        add("xrange", key)
        add("xrevrange", key)
        for low, high in (("-", "+"), ("1000", "1000"), ("1000-1", "2000-0"),
                          ("(1000-0", "(2000-1"), ("1001", "+"), ("-", "(1001-0"),
                          ("2001", "+"), ("1500", "1999"), ("1000-2", "1000-2")):
            add("xrange", key, low, high)
            add("xrange", key, low, high, count=2)
            add("xrevrange", key, high, low)
            add("xrevrange", key, high, low, count=1)
        add("xrevrange", key, count=1)
    for key in every:
        add("type", key)
        add("exists", key)
    add("exists", sk.meta, sk.inbox, sk.entries, sk.meta, *others, sk.receipts, sk.nudge)
    for key in (sk.nudge, *others):
        add("get", key)
    for key in others:
        add("zcard", key)
        add("zscore", key, sk.session_id)
        add("zrange", key, 0, -1, withscores=True)
        add("zcount", key, "-inf", "+inf")
        add("zrevrangebyscore", key, "+inf", "-inf", start=0, num=5, withscores=True)
    # A command on a key of another type: Redis' WRONGTYPE error, from both.
    add("hgetall", sk.entries)
    add("lrange", sk.meta, 0, -1)
    add("xrange", sk.meta)
    add("get", sk.meta)
    add("zcard", sk.meta)
    return out


async def answer(target: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        return await getattr(target, name)(*args, **kwargs)
    except ResponseError as exc:
        return ("error", str(exc).split(" ", 1)[0])


def assert_same_reads(redis_replies: list[Any], view_replies: list[Any],
                      calls: list[Any]) -> None:
    for call, from_redis, from_view in zip(calls, redis_replies, view_replies, strict=True):
        assert from_view == from_redis, call
        assert type(from_view) is type(from_redis), call
        if isinstance(from_redis, list) and from_redis:
            assert type(from_view[0]) is type(from_redis[0]), call  # (id, fields) tuples


async def same_as_redis(store: Store, sk: SessionKeys, view: ArchivedKeys,
                        others: list[str]) -> int:
    """Send every read to Redis and to the view, one by one and in pipelines."""
    calls = reads(sk, others)
    redis: Any = store.redis
    from_redis = [await answer(redis, *c) for c in calls]
    from_view = [await answer(view, *c) for c in calls]
    assert_same_reads(from_redis, from_view, calls)
    # The same reads in one pipeline each (the WRONGTYPE ones returned in place).
    replies = []
    for target in (redis, view):
        async with target.pipeline(transaction=False) as p:
            for name, args, kwargs in calls:
                getattr(p, name)(*args, **kwargs)
            replies.append(await p.execute(raise_on_error=False))
    errors = [[type(r).__name__ for r in rs if isinstance(r, Exception)] for rs in replies]
    assert errors[0] == errors[1] and len(errors[0]) == 5
    as_pairs: Callable[[list[Any]], list[Any]] = lambda rs: [  # noqa: E731
        ("error", str(r).split(" ", 1)[0]) if isinstance(r, ResponseError) else r for r in rs]
    assert_same_reads(as_pairs(replies[0]), as_pairs(replies[1]), calls)
    return len(calls)


async def test_every_read_answers_as_redis_does(store: Store) -> None:
    sk = store.keys.session("s-archived")
    await fill(store.redis, sk)
    archived = await snapshot(store.redis, sk, archived_ms=5000)
    assert archived.namespace == store.keys.ns and archived.seq == 7 and archived.fence == 3
    assert archived.summary.model_dump() == {
        "agent": "notices", "compat": 1, "status": "failed", "created_ms": 1000,
        "settled_ms": 2600, "submissions": 2}
    assert archived.inbox == {} and archived.poison == {} and archived.nudge == "1"
    # The idempotency records are not archived: in Redis they expire; here they go at once.
    await store.redis.delete(sk.applied)
    view = ArchivedKeys(decode(encode(archived)), sk)  # as it comes back from the archive
    # The shard's keys and another session's, missing in this Redis, as the view has them.
    other = store.keys.session("s-other")
    others = [other.meta, other.entries, other.receipts, other.nudge, sk.outbox, sk.wakes,
              sk.timers, sk.sessions, store.keys.dead(sk.session_id, "brain")]
    assert await same_as_redis(store, sk, view, others) > 300
    for target in (store.redis, view):  # refused by redis-py before it sends anything
        with pytest.raises(DataError, match="XRANGE count must be a positive integer"):
            await target.xrange(sk.receipts, count=0)


async def test_a_transaction_pipeline_answers_as_a_load_reads(store: Store) -> None:
    """The store's own load (loading.queue_load) through a MULTI pipeline, chained calls."""
    sk = store.keys.session("s-loaded")
    await fill(store.redis, sk)
    view = ArchivedKeys(await snapshot(store.redis, sk), sk)
    replies = []
    for target in (store.redis, view):
        async with target.pipeline(transaction=True) as p:
            queue_load(p, sk, 3)
            replies.append(await p.execute())
    assert replies[0] == replies[1]
    # An error raises from execute() when raise_on_error is left on, as Redis' does.
    for target in (store.redis, view):
        async with target.pipeline(transaction=False) as p:
            p.hgetall(sk.meta).hgetall(sk.entries)
            with pytest.raises(ResponseError, match="WRONGTYPE"):
                await p.execute()


async def test_a_session_with_nothing_but_requests_snapshots(store: Store) -> None:
    sk = store.keys.session("s-unopened")
    await store.redis.hset(sk.inbox, "submit:r-1", '{"agent":"notices"}')
    await store.redis.xadd(sk.receipts, {"kind": "submit"}, id="5-0")
    archived = await snapshot(store.redis, sk)
    assert (archived.seq, archived.fence, archived.meta) == (0, 0, {})
    assert archived.summary.agent == "" and archived.summary.submissions == 0
    view = ArchivedKeys(archived, sk)
    assert await view.exists(sk.meta, sk.inbox, sk.receipts) == 2
    assert await view.hgetall(sk.inbox) == {"submit:r-1": '{"agent":"notices"}'}


async def test_writes_to_the_view_are_refused(store: Store) -> None:
    sk = store.keys.session("s-refuses")
    await fill(store.redis, sk)
    view = ArchivedKeys(await snapshot(store.redis, sk, archived_ms=5000, fence=4), sk)
    with pytest.raises(ArchivedError, match="session s-refuses is archived") as caught:
        await view.hset(sk.meta, "holder", "me")
    assert (caught.value.session_id, caught.value.archived_ms, caught.value.fence) == (
        "s-refuses", 5000, 4)
    with pytest.raises(ArchivedError):
        view.pipeline().hgetall(sk.meta).xadd(sk.receipts, {"kind": "x"})
    with pytest.raises(ArchivedError):
        await view.evalsha("abc", 1, sk.meta)
    with pytest.raises(AttributeError, match="answers only the reads"):
        await view.lindex(sk.entries, 0)
    with pytest.raises(ValueError, match="keys of session s-other"):
        ArchivedKeys(view.archived, store.keys.session("s-other"))


async def test_a_real_session_reads_the_same_from_the_archive(
        settings: Settings, mailbox: MailboxServer, tmp_path: Path) -> None:
    """Five notices run on real servers; the settled session is snapshot, archived in a
    directory, loaded back, and read as Redis reads it."""
    from tests.integration.test_e2e_inprocess import FIVE

    settings = settings.model_copy(update={"mail_url": mailbox.url})
    async with running(*trio(settings, app)):
        client = await Client.connect(settings)
        try:
            sub, _ = await client.submit(FIVE, agent="notices")
            final = await client.wait(sub, timeout=20)
        finally:
            await client.close()
    assert final.status == "completed"
    store = await Store.connect(settings)
    try:
        sk = store.keys.session(sub.session_id)
        archived = await snapshot(store.redis, sk)
        assert archived.summary.status == "completed" and archived.summary.submissions == 1
        assert len(archived.entries) >= 7 and archived.receipts and archived.runs_done
        async with Archive.from_url(str(tmp_path / "archive")) as archive:
            await archive.save(archived)
            loaded = await archive.load(settings.namespace, sub.session_id)
        assert loaded == archived
        view = ArchivedKeys(loaded, sk)
        await store.redis.delete(sk.applied)  # not archived (in Redis it expires)
        await same_as_redis(store, sk, view, [])
        # The shard's keys, which hold the run's rows in this Redis, read as missing.
        for key in (sk.outbox, sk.wakes, sk.timers, sk.sessions):
            assert await view.type(key) == "none" and not await view.exists(key)
        assert await view.xlen(sk.outbox) == 0 and await view.zcard(sk.sessions) == 0
        assert await view.zscore(sk.sessions, sub.session_id) is None
    finally:
        await store.close()
