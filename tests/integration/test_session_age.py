"""A session's step costs the same however old the session is (issue 45, item 5).

Invariants, each checked on a real ``redis-server`` that a replica follows, by counting what
the server did (commands from its slow log, bytes from ``INFO``), never by timing:

* a lease reads none of the submissions the session settled: its commands and the bytes it
  reads are the same after one settled submission and after forty (meta holds the open
  ones, see commit.lua; the subs hash keeps them all for the clients' reads);
* a session whose open submission a Brain of an earlier version committed (not in meta)
  still loads it;
* streamed text costs bytes linear in its length: each save sends and replicates only its
  chunk (partial.lua), and a duplicate or stale chunk is refused with nothing written;
* the receipts stream stays bounded (``Settings.receipts_kept``) however many receipts come.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from baton.devkit.servers import RedisServer
from baton.models import Entry, Task, Terminal, WorkerRef
from baton.settings import Settings
from baton.store.store import Store, now_ms, worker_ref
from baton.store.writes import Writes
from tests.helpers import take_up

BRAIN = WorkerRef(role="brain", name="brain-age", pid=0)
CLIENT = worker_ref("client", "c")
WAKE = "baton.wake.notices.1"
#: A settled answer's text: forty of them read by every lease would be ~40 KB.
ANSWER = "All five notices went out; each recipient confirmed once. " * 16


@pytest.fixture(scope="module")
async def primary() -> AsyncIterator[RedisServer]:
    """A private server and a replica following it: its counters are this module's alone,
    and ``master_repl_offset`` counts the bytes it replicates."""
    async with RedisServer() as server, RedisServer() as replica:
        follower = Redis.from_url(replica.url, decode_responses=True)
        leader = Redis.from_url(server.url, decode_responses=True)
        try:
            host, port = server.url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
            await follower.replicaof(host, int(port))
            deadline = time.monotonic() + 30
            while ((await follower.info("replication")).get("master_link_status") != "up"
                   or int((await leader.info("replication"))["connected_slaves"]) < 1):
                assert time.monotonic() < deadline, "the replica did not sync"
                await asyncio.sleep(0.02)
        finally:
            await follower.aclose()
            await leader.aclose()
        yield server


@pytest.fixture
async def aged(primary: RedisServer) -> AsyncIterator[Store]:
    # A page of one entry: the page a lease reads is bounded (entries_page) and not what
    # these tests count.
    store = await Store.connect(Settings(redis_url=primary.url, entries_page=1,
                                         namespace="a" + uuid.uuid4().hex[:10]))
    try:
        yield store
    finally:
        await store.close()


async def _submit(store: Store, sid: str, k: int) -> Task:
    task = Task(id=f"{sid}-t{k}", kind="generation", owner=sid, submission_id=f"{sid}-s{k}",
                created_ms=k)
    await store.inbox.submit(sid, agent="notices", compat=1, wake_subject=WAKE,
                             request_id=f"r{k}", text=f"request {k}", task=task, worker=CLIENT,
                             submission_id=task.submission_id or "")
    await take_up(store, sid, BRAIN)
    return task


async def _settle(store: Store, sid: str, task: Task) -> None:
    lease, state = await store.acquire_and_load(sid, BRAIN, 60_000)
    sub = state.submissions[task.submission_id or ""]
    await store.commit(sid, lease.fence, Writes(
        kind="final", tasks=[state.tasks[task.id].model_copy(
            update={"state": Terminal(outcome="completed")})],
        submissions=[sub.model_copy(update={"status": "completed", "answer": ANSWER,
                                            "settled_ms": now_ms()})],
        deadline_ms=-1), BRAIN)
    await store.release(sid, lease.fence, 60_000)


async def _session(store: Store, settled: int) -> tuple[str, Task]:
    """A session with ``settled`` settled submissions and one open."""
    sid = f"age-{settled}-{uuid.uuid4().hex[:6]}"
    for k in range(settled):
        await _settle(store, sid, await _submit(store, sid, k))
    return sid, await _submit(store, sid, settled)


async def _info(redis: Any) -> tuple[int, int, int]:
    """Bytes the clients sent and got, and the replication stream's offset."""
    info = await redis.execute_command("INFO", "stats", "replication")
    return (int(info["total_net_input_bytes"]), int(info["total_net_output_bytes"]),
            int(info["master_repl_offset"]))


async def _counted(redis: Any, call: Any) -> tuple[int, int, int]:
    """What ``call()`` cost the server: bytes in, bytes out, bytes replicated (less what
    reading the counters costs, measured around no call)."""
    a = await _info(redis)
    b = await _info(redis)
    await call()
    c = await _info(redis)
    return tuple(z - y - (y - x) for x, y, z in zip(a, b, c, strict=True))  # type: ignore[return-value]


async def _lease_commands(store: Store, sid: str) -> list[list[str]]:
    """The commands a lease (and its load) ran, those its script called included, from the
    slow log set to log every command."""
    redis = store.redis
    await redis.config_set("slowlog-max-len", 1024)
    await redis.config_set("slowlog-log-slower-than", 0)
    try:
        await redis.slowlog_reset()
        lease, _ = await store.acquire_and_load(sid, BRAIN, 60_000)
        log = await redis.slowlog_get(1024)
    finally:
        await redis.config_set("slowlog-log-slower-than", 10_000)
    await store.release(sid, lease.fence, 60_000)
    return [[a.decode() if isinstance(a, bytes) else str(a) for a in e["command"].split()]
            for e in reversed(log) if not bytes(e["command"]).startswith(b"SLOWLOG")]


async def test_a_lease_reads_none_of_the_settled_submissions(aged: Store) -> None:
    young, young_task = await _session(aged, 1)
    old, old_task = await _session(aged, 40)
    subs = aged.keys.session(old).subs
    assert await aged.redis.hlen(subs) == 41  # every submission stays for the clients' reads

    ran = await _lease_commands(aged, old)
    # the script declares it (FCALL); inside, its type is checked and nothing read
    on_subs = [c for c in ran if subs in c and c[0] not in ("FCALL", "EVALSHA", "EVAL")]
    assert on_subs == [["HLEN", subs]], on_subs
    assert len(ran) == len(await _lease_commands(aged, young))

    async def lease(sid: str) -> None:
        got, state = await aged.acquire_and_load(sid, BRAIN, 60_000)
        assert list(state.submissions) == [f"{sid}-s{1 if sid == young else 40}"]
        await aged.release(sid, got.fence, 60_000)

    _, young_out, _ = await _counted(aged.redis, lambda: lease(young))
    _, old_out, _ = await _counted(aged.redis, lambda: lease(old))
    # Forty settled answers read by the lease would be over 30 KB more; a few bytes move
    # with the counters' digits.
    assert abs(old_out - young_out) < 200, (young_out, old_out)
    # and the client still reads every settled answer
    first = await aged.inbox.submission(old, f"{old}-s0")
    assert first.status == "completed" and first.answer == ANSWER
    assert (await aged.inbox.submission(old, old_task.submission_id or "")).status == "accepted"
    assert young_task.submission_id


async def test_an_open_submission_committed_before_meta_held_it_still_loads(
    aged: Store,
) -> None:
    sid, task = await _session(aged, 2)
    sk = aged.keys.session(sid)
    sub_id = task.submission_id or ""
    # As a Brain of an earlier version left it: the subs hash only, nothing in meta.
    assert await aged.redis.hdel(sk.meta, f"sub:{sub_id}") == 1
    lease, state = await aged.acquire_and_load(sid, BRAIN, 60_000)
    assert list(state.submissions) == [sub_id]
    assert state.submissions[sub_id].status == "accepted"
    await aged.release(sid, lease.fence, 60_000)
    await _settle(aged, sid, task)
    assert (await aged.inbox.submission(sid, sub_id)).status == "completed"
    assert not [f for f in await aged.redis.hkeys(sk.meta) if f.startswith("sub:")]


async def _stream(store: Store, chars: int, chunk: int = 40) -> tuple[int, int, str]:
    """Stream a text of ``chars`` characters in saves of ``chunk``: (bytes sent, bytes
    replicated, the text saved)."""
    sid, task = await _session(store, 0)
    lease, _ = await store.acquire_and_load(sid, BRAIN, 60_000)
    text = ("Notices went out to each customer, one by one, é. " * (chars // 40))[:chars]

    async def save_all() -> None:
        for end in range(chunk, chars + 1, chunk):
            at = await store.save_partial(
                sid, lease.fence, BRAIN, task_id=task.id, request_id="q:1:0",
                offset=len(text[:end - chunk].encode()), delta=text[end - chunk:end],
                chars=end)
            assert at == len(text[:end].encode())

    sent, _, replicated = await _counted(store.redis, save_all)
    saved = await store.partial(sid)
    assert saved is not None and saved.task_id == task.id and saved.request_id == "q:1:0"
    # the next commit clears it, every chunk
    await store.commit(sid, lease.fence, Writes(kind="next", entries=[
        Entry(kind="model", text=saved.text, task_id=task.id, ts_ms=now_ms())]), BRAIN)
    assert await store.partial(sid) is None
    assert not [f for f in await store.redis.hkeys(store.keys.session(sid).meta)
                if f.startswith("partial")]
    return sent, replicated, saved.text


async def test_streamed_text_costs_bytes_linear_in_its_length(aged: Store) -> None:
    short_sent, short_replicated, short = await _stream(aged, 1_000)
    long_sent, long_replicated, long = await _stream(aged, 8_000)
    assert len(short) == 1_000 and len(long) == 8_000 and long.startswith(short[:960])
    # Rewriting the whole text at each save costs ~chars / (2 x chunk) bytes per character:
    # eight times more for a text eight times longer. Linear: the same per character.
    for s, lg in ((short_sent, long_sent), (short_replicated, long_replicated)):
        assert lg / 8_000 <= 1.15 * s / 1_000, (s, lg)


async def test_a_duplicate_stale_or_misplaced_chunk_is_refused_and_writes_nothing(
    aged: Store,
) -> None:
    sid, task = await _session(aged, 0)
    lease, _ = await aged.acquire_and_load(sid, BRAIN, 60_000)
    sk = aged.keys.session(sid)

    async def save(offset: int, delta: str, request: str = "q:1:0",
                   fence: int = lease.fence) -> int | None:
        return await aged.save_partial(sid, fence, BRAIN, task_id=task.id, request_id=request,
                                       offset=offset, delta=delta, chars=0)

    async def receipts() -> int:
        return int(await aged.redis.xlen(sk.receipts))

    assert await save(0, "Héllo ") == 7
    n = await receipts()
    assert await save(0, "Héllo ") == 7  # the same chunk again: refused, where it ends said
    assert await save(3, "llo wor") == 7  # misplaced
    assert await save(7, "x", fence=lease.fence + 1) is None  # a stale fence
    assert await receipts() == n
    assert await save(7, "world") == 12
    saved = await aged.partial(sid)
    assert saved is not None and saved.text == "Héllo world"
    # another attempt's text starts at 0 and replaces it
    assert await save(5, "again", request="q:1:1") == 0
    assert await save(0, "Again", request="q:1:1") == 5
    saved = await aged.partial(sid)
    assert saved is not None and (saved.request_id, saved.text) == ("q:1:1", "Again")
    assert not [f for f in await aged.redis.hkeys(sk.meta) if f.startswith("partial.")]
    # A text a Brain of an earlier version saved whole reads, and grows, the same.
    await aged.redis.hset(sk.meta, mapping={"partial": "Saved whole",
                                            "partial_of": f"{task.id} q:1:2"})
    await aged.redis.hdel(sk.meta, "partial_n", "partial_len")
    assert await save(11, ", then more.", request="q:1:2") == 23
    saved = await aged.partial(sid)
    assert saved is not None and saved.text == "Saved whole, then more."


async def test_the_receipts_stream_stays_bounded(primary: RedisServer) -> None:
    settings = Settings(redis_url=primary.url, namespace="a" + uuid.uuid4().hex[:10],
                        receipts_kept=100)
    store = await Store.connect(settings)
    try:
        sid, task = await _session(store, 0)
        lease, _ = await store.acquire_and_load(sid, BRAIN, 60_000)
        for i in range(600):  # a receipt each
            await store.save_partial(sid, lease.fence, BRAIN, task_id=task.id,
                                     request_id="q:1:0", offset=i, delta="x", chars=i + 1)
        await store.commit(sid, lease.fence, Writes(kind="last"), BRAIN)
        sk = store.keys.session(sid)
        # MAXLEN ~ trims whole stream nodes (100 entries each): about the newest 100 stay
        assert 100 <= await store.redis.xlen(sk.receipts) < 250
        newest = await store.receipts(sid)
        assert newest[-1].kind == "commit"
        assert int((await store.redis.xinfo_stream(sk.receipts))["entries-added"]) > 600
    finally:
        await store.close()
