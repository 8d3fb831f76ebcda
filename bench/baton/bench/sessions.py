"""Five-notice sessions against a running stack: the workload every session benchmark runs.

One model turn asks for five ``send_email`` calls (one per address of :data:`FIVE`), then a
summary turn: :data:`STEPS` steps. :func:`sessions` runs them at a concurrency through a
client made for it (:func:`bench_client`) and times each from submit to settled.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from baton.bench.common import Run, concurrent
from baton.client import Client
from baton.devkit.devstack import DevStack

__all__ = ["FIVE", "STEPS", "bench_client", "session_call", "sessions"]

FIVE = ("Send the approved notice to ada@example.com, grace@example.com, linus@example.com, "
        "margaret@example.com and barbara@example.com, then summarise.")
STEPS = 7  # per five-notice session: two model turns and five tool calls


async def bench_client(stack: DevStack) -> Client:
    """A client for up to 128 sessions in flight: room for 1,024 Redis connections (per node
    of a cluster), so a burst of waits never queues behind the pool."""
    return await Client.connect(stack.settings(worker_name="bench-client",
                                               redis_max_connections=1024))


def session_call(client: Client, text: str) -> Callable[[int], Awaitable[None]]:
    """One session of ``text`` for the ``notices`` agent, submitted and waited for."""
    async def call(_i: int) -> None:
        sub, _ = await client.submit(text, agent="notices")
        final = await client.wait(sub, timeout=30)
        if final.status != "completed":
            raise RuntimeError(f"session {sub.session_id} ended {final.status}: {final.error}")

    return call


async def sessions(client: Client, concurrency: int, total: int, warmup: int) -> Run:
    """``total`` five-notice sessions, ``concurrency`` at a time, after ``warmup`` each."""
    call = session_call(client, FIVE)
    return await concurrent([call] * concurrency, max(1, total // concurrency), warmup)
