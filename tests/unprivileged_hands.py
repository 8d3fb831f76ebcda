"""A Hands worker that is not root, for tests/integration/test_isolation.py (the suite runs as
root): ``unshare --mount -- python -m tests.unprivileged_hands UID``.

As root, in the mount namespace of its own that ``unshare`` gave it, it makes reachable the
directories its interpreter and ``sys.path`` need below a directory other users may not enter
(a pyenv under ``/root``), the way a root Hands does for its children
(:func:`baton.hands.isolation.exposed`); then it becomes ``UID`` (no groups) for good and
serves the tools of :mod:`tests.isolated_apps` with the ``BATON_*`` settings of its
environment. Nothing else of the machine is changed: what it and its children may do is what
any process of that uid may.

stdout, a JSON document a line: what :func:`~baton.hands.isolation.confinement` found, then
``{"ready": true}`` once it consumes. It drains and ends when its stdin is closed.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import os
import sys

import orjson

from baton.app import Agent, App
from baton.hands import HandsWorker, isolation
from baton.hands.isolated import _expose
from baton.settings import Settings
from tests.isolated_apps import dial, dial_out, escape, greet, holder, peek, reader

APP = App(agents=[Agent(name="iso", tools=("greet",))],
          tools=[greet, holder, reader, escape, dial, dial_out, peek])


def become(uid: int) -> None:
    """Expose what the interpreter needs, then take ``uid`` as every id, with no groups."""
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    needed = [sys.executable, sys.prefix, sys.base_prefix, *(p for p in sys.path if p)]
    for closed, paths in isolation.exposed(needed).items():
        _expose(closed, paths, check, libc)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def say(document: dict[str, object]) -> None:
    sys.stdout.buffer.write(orjson.dumps(document) + b"\n")
    sys.stdout.flush()


async def serve() -> None:
    worker = HandsWorker(Settings.from_env(), APP)
    loop = asyncio.get_running_loop()
    serving = asyncio.create_task(worker.serve())
    ready = asyncio.create_task(worker.ready.wait())
    await asyncio.wait({serving, ready}, return_when=asyncio.FIRST_COMPLETED)
    if serving.done():
        serving.result()
    say({"ready": True})
    await loop.run_in_executor(None, sys.stdin.buffer.read)  # until the test closes it
    worker.shutdown()
    await serving


def main() -> None:
    become(int(sys.argv[1]))
    say(dataclasses.asdict(isolation.confinement()))
    asyncio.run(serve())


if __name__ == "__main__":
    main()
