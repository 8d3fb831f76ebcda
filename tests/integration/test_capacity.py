"""A full Redis loses no acknowledged work (baton.store.capacity), against private servers.

* A Redis that may evict keys is refused at start, with the setting named.
* A Redis out of memory refuses a client's submission with a retryable StoreFullError (the
  API's 503 and Retry-After), nothing written; Brains that cannot commit back off; once
  there is room again the work resumes by itself and every mail goes out once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.devkit.servers import RedisServer
from baton.errors import ConfigError, StoreFullError
from baton.examples.notices import app
from baton.settings import Settings
from baton.store.epoch import StoreEpoch
from baton.store.store import Store
from tests.helpers import eventually, running, trio

FIVE = ("Send the approved notice to ada@example.com, grace@example.com, linus@example.com, "
        "margaret@example.com and barbara@example.com, then summarise.")


@pytest.fixture
async def own_redis(tmp_path: Any) -> AsyncIterator[RedisServer]:
    """A Redis of this test's own: its memory limit is changed."""
    async with RedisServer(tmp_path / "redis") as server:
        yield server


async def oom_refusals(admin: aioredis.Redis) -> int:
    """Commands this Redis refused for want of memory so far."""
    stats = await admin.info("errorstats")
    return int(stats.get("errorstat_OOM", {}).get("count", 0))


async def test_a_redis_that_may_evict_keys_is_refused_at_start(
        own_redis: RedisServer, settings: Settings) -> None:
    admin = aioredis.Redis.from_url(own_redis.url, decode_responses=True)
    await admin.config_set("maxmemory-policy", "allkeys-lru")
    store = await Store.connect(settings.model_copy(update={"redis_url": own_redis.url}))
    try:
        with pytest.raises(ConfigError, match="maxmemory-policy allkeys-lru") as refused:
            await StoreEpoch.establish(store.redis, store.keys)
        assert "noeviction" in str(refused.value)
        assert await admin.dbsize() == 0  # refused before anything was written
        await admin.config_set("maxmemory-policy", "noeviction")
        await StoreEpoch.establish(store.redis, store.keys)
    finally:
        await store.close()
        await admin.aclose()


async def test_a_full_redis_refuses_input_retryably_and_work_resumes_when_room_returns(
        own_redis: RedisServer, settings: Settings, mailbox: MailboxServer) -> None:
    """The mail service holds its answers while Redis fills up: the Hands' results and the
    Brain's commits are refused for want of memory and retried, a new submission is refused
    with StoreFullError; once there is room the session completes, every mail sent once."""
    settings = settings.model_copy(update={"redis_url": own_redis.url, "mail_url": mailbox.url})
    admin = aioredis.Redis.from_url(own_redis.url, decode_responses=True)
    async with running(*trio(settings, app)), httpx.AsyncClient() as http:
        client = await Client.connect(settings)
        try:
            await http.post(f"{mailbox.url}/hold")
            sub, _ = await client.submit(FIVE, agent="notices")  # accepted before the limit

            async def all_sent() -> bool:
                stats = (await http.get(f"{mailbox.url}/stats")).json()
                return len(stats["deliveries"]) == 5
            await eventually(all_sent, timeout=30, message="five mails sent, answers held")
            used = int((await admin.info("memory"))["used_memory"])
            await admin.config_set("maxmemory", str(used))  # full from now on
            keys_before = await admin.dbsize()
            with pytest.raises(StoreFullError) as full:
                await client.submit(FIVE, agent="notices", session_id="another")
            assert full.value.retryable and full.value.reason == "memory"
            assert await admin.dbsize() == keys_before  # nothing of it written
            refused = await oom_refusals(admin)
            await http.post(f"{mailbox.url}/release")  # the results come back to a full Redis
            await eventually(lambda: _more(admin, refused), timeout=30,
                             message="a worker's write refused for want of memory")
            await admin.config_set("maxmemory", "0")  # room again
            final = await client.wait(sub, timeout=60)
        finally:
            await client.close()
            await admin.aclose()
        stats = (await http.get(f"{mailbox.url}/stats")).json()
    assert final.status == "completed"
    assert sorted(stats["deliveries"].values()) == [1] * 5


async def _more(admin: aioredis.Redis, than: int) -> bool:
    return await oom_refusals(admin) > than


@pytest.fixture
def small_disk(tmp_path: Any) -> Any:
    """A 16 MB tmpfs of this test's own (root only): a disk that fills up on purpose."""
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_a_full_disk_stops_redis_and_no_acknowledged_work_is_lost(
        small_disk: Any, settings: Settings, mailbox: MailboxServer) -> None:
    """A durable Redis (appendfsync always) whose disk fills up cannot write its AOF and
    exits rather than acknowledge what it could not keep (Redis' own rule for that policy):
    the client's submission in flight gets a retryable error; every submission acknowledged
    before is still there once space is freed and Redis starts again on the same files,
    and those sessions complete, each mail sent once."""
    from baton.errors import UnavailableError

    filler = small_disk / "filler"
    async with RedisServer(small_disk / "redis", durable=True) as redis_server:
        settings = settings.model_copy(update={"redis_url": redis_server.url,
                                               "mail_url": mailbox.url})
        client = await Client.connect(settings)
        acknowledged = []
        try:
            # the first submission loads the scripts' function library (its FUNCTION LOAD
            # goes to the AOF too) while there is room
            sub, _ = await client.submit(FIVE, agent="notices", session_id="disk-first")
            acknowledged.append(sub)
            free = _free_bytes(small_disk)
            filler.write_bytes(b"\0" * max(0, free - 64 * 1024))  # leave about 64 KB
            with pytest.raises(UnavailableError):
                for i in range(10_000):  # each submission appends to the AOF
                    sub, _ = await client.submit(FIVE, agent="notices",
                                                 session_id=f"disk-{i}")
                    acknowledged.append(sub)
            assert acknowledged
            # Redis exits on the AOF error (the client may see the reset before it is reaped)
            await eventually(lambda: not redis_server.running, timeout=30,
                             message="Redis exited on its AOF write error")
            filler.unlink()  # space again
            await redis_server.restart()
            async with running(*trio(settings, app)):
                finals = [await client.wait(sub, timeout=120) for sub in acknowledged]
        finally:
            await client.close()
    assert all(f.status == "completed" for f in finals)
    async with httpx.AsyncClient() as http:
        stats = (await http.get(f"{mailbox.url}/stats")).json()
    assert sorted(set(stats["deliveries"].values())) == [len(acknowledged)]


def _free_bytes(path: Any) -> int:
    import os

    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


async def test_a_full_jetstream_refuses_new_input_and_drains_when_workers_return(
        settings: Settings, mailbox: MailboxServer) -> None:
    """Streams of three messages and no Brain: the relay finds the wake stream full and says
    so in Redis; the next submission is refused with StoreFullError (reason bus), nothing
    written; once Brains and Hands run the streams drain, the refusal lapses, and every
    session completes, each mail sent once."""
    from baton.brain.worker import BrainWorker
    from baton.hands.worker import HandsWorker
    from baton.relay.worker import Relay

    settings = settings.model_copy(update={"stream_max_msgs": 3, "mail_url": mailbox.url})
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    client = await Client.connect(settings)
    try:
        async with running(relay):
            subs = [(await client.submit(FIVE, agent="notices", session_id=f"js-{i}"))[0]
                    for i in range(4)]  # the fourth wake finds the stream full
            keys = client.store.keys
            await eventually(lambda: client.store.redis.exists(keys.full(0)), timeout=30,
                             message="the relay's mark that JetStream is full")
            with pytest.raises(StoreFullError) as full:
                await client.submit(FIVE, agent="notices", session_id="js-refused")
            assert full.value.retryable and full.value.reason == "bus"
            assert not await client.store.redis.exists(
                keys.session("js-refused").inbox)  # nothing of it written
            brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), app)
            hands = HandsWorker(settings.model_copy(update={"worker_name": "hands-1"}), app)
            async with running(brain, hands):
                finals = [await client.wait(sub, timeout=60) for sub in subs]

                async def accepted() -> Any:
                    try:
                        return (await client.submit(FIVE, agent="notices",
                                                    session_id="js-later"))[0]
                    except StoreFullError:
                        return None
                later = await eventually(accepted, timeout=30, message="input accepted again")
                finals.append(await client.wait(later, timeout=60))
    finally:
        await client.close()
    assert [f.status for f in finals] == ["completed"] * 5
    async with httpx.AsyncClient() as http:
        stats = (await http.get(f"{mailbox.url}/stats")).json()
    assert sorted(stats["deliveries"].values()) == [5] * 5  # one per recipient and session
