"""Scripts queued in pipelines survive a server that lost its function library.

Pipelined scripts (a Brain's acquire with its snapshot, a relay's lease renewals) are sent
as FCALL with no check before each pipeline; a server without the library (a node restarted
empty, one that never had it) answers "function not found", and the pipeline runs again
once the library is loaded.
"""

from __future__ import annotations

from typing import Any

from baton.models import Task
from baton.settings import Settings
from baton.store.outbox import Outbox
from baton.store.store import Store, worker_ref
from tests.helpers import take_up

BRAIN = worker_ref("brain", "brain-reload")
CLIENT = worker_ref("client", "c")


async def _commands(store: Store) -> dict[str, int]:
    stats = await store.redis.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


async def test_acquire_and_load_after_the_functions_were_flushed(settings: Settings) -> None:
    store = await Store.connect(settings)
    try:
        sid = "reload-1"
        await store.inbox.submit(sid, agent="notices", compat=1, wake_subject="a.wake.notices.1",
                                 request_id="r", text="hi",
                                 task=Task(id=f"{sid}-t", kind="generation", owner=sid),
                                 worker=CLIENT, submission_id=f"{sid}-sub")
        await take_up(store, sid)  # a Brain opens the session with its task (fence 1)
        before = await _commands(store)
        lease, state = await store.acquire_and_load(sid, BRAIN, 60_000)
        after = await _commands(store)
        assert after.get("function|list", 0) == before.get("function|list", 0)
        assert lease.fence == 2 and len(state.tasks) == 1
        await store.release(sid, lease.fence, 60_000)

        await store.redis.function_flush()
        lease, state = await store.acquire_and_load(sid, BRAIN, 60_000)
        assert lease.fence == 3 and len(state.tasks) == 1  # applied once, after the reload
    finally:
        await store.close()


async def test_relay_lease_renewals_after_the_functions_were_flushed(
    settings: Settings,
) -> None:
    store = await Store.connect(settings)
    box: Any = Outbox(store.redis, store.keys)
    try:
        held = {}
        for shard in (0, 1, 2):
            answer = await box.lease("acquire", shard, "relay-r", 60_000)
            assert answer.ok
            held[shard] = answer.fence
        await store.redis.function_flush()
        renewed = await box.renew_all(held, "relay-r", 60_000)
        assert all(a.ok and a.fence == held[s] for s, a in renewed.items()), renewed
    finally:
        for shard in (0, 1, 2):
            await box.lease("release", shard, "relay-r", 60_000, held.get(shard, 0))
        await store.close()
