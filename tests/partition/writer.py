"""A Brain-like writer for partition tests, run as its own process (in a network namespace).

``python -m tests.partition.writer URL NAMESPACE ACK_LOG SESSION...`` submits each session,
takes its lease and commits entries ``<session>/<n>`` until SIGTERM (then exits 0),
writing one JSON line per acknowledgement it got (``submit``, ``lease`` with its fence,
``entry`` with its text) and per failure (``fail``) to ``ACK_LOG``, flushed at once: the log
the test checks the store against. A write in doubt or refused is handled as a Brain does:
take the lease again, reload, and acknowledge an in-doubt entry that did land instead of
committing it again.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from typing import IO, Any

from baton.brain.requests import request_writes
from baton.errors import LeaseBusyError, StaleFenceError, UnavailableError
from baton.models import Entry, Task
from baton.settings import Settings
from baton.store.store import Store, worker_ref
from baton.store.writes import Writes

WAKE = "part.wake.notices.1"
FAILURES = (UnavailableError, StaleFenceError, LeaseBusyError, OSError)


def _log(out: IO[str], **fields: Any) -> None:
    out.write(json.dumps({"t": round(time.time(), 3), **fields}) + "\n")
    out.flush()


async def _session(store: Store, sid: str, out: IO[str], stop: asyncio.Event) -> None:
    brain = worker_ref("brain", f"brain-{sid}")
    while True:
        try:
            await store.inbox.submit(
                sid, agent="notices", compat=1, wake_subject=WAKE, request_id="r1", text="hi",
                task=Task(id="t1", kind="generation", owner=sid),
                worker=worker_ref("client", "c"), submission_id=f"sub-{sid}")
            _log(out, kind="submit", sid=sid)
            break
        except FAILURES as exc:
            _log(out, kind="fail", sid=sid, what="submit", error=type(exc).__name__)
    n, fence = 0, 0
    while not stop.is_set():
        text = f"{sid}/{n}"
        try:
            if not fence:
                lease, state = await store.acquire_and_load(sid, brain, 60_000)
                fence = lease.fence
                _log(out, kind="lease", sid=sid, fence=fence)
                if state.requests:  # as a Brain: take the submit request up first
                    await store.commit(sid, fence, request_writes(state)[0], brain)
                if any(e.text == text for e in await store.entries(sid)):
                    _log(out, kind="entry", sid=sid, text=text)
                    n += 1
                    continue
            await store.commit(sid, fence, Writes(entries=[Entry(kind="model", text=text)]),
                               brain)
            _log(out, kind="entry", sid=sid, text=text)
            n += 1
        except FAILURES as exc:
            _log(out, kind="fail", sid=sid, what="commit", error=type(exc).__name__)
            fence = 0
            await asyncio.sleep(0.05)  # pacing between attempts, not a wait for an event


async def main(url: str, namespace: str, out: IO[str], sessions: list[str]) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    settings = Settings.from_env(redis_url=url, namespace=namespace, shards=16,
                                 connect_timeout_s=0.5, redis_replica_timeout_ms=500,
                                 redis_in_doubt_retry_ms=2_000)
    store = await Store.connect(settings)
    try:
        await asyncio.gather(*(_session(store, sid, out, stop) for sid in sessions))
    finally:
        await store.close()


if __name__ == "__main__":
    with open(sys.argv[3], "a") as ack_log:
        asyncio.run(main(sys.argv[1], sys.argv[2], ack_log, sys.argv[4:]))
