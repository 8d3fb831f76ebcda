"""Is a Hands still connected? Asked over NATS, answered by the server itself when it is not.

Every Hands subscribes to its own liveness subject (:func:`liveness_subject`) and answers
each request with an empty reply. A Hands that claims a run and finds it ``busy`` (another
attempt's heartbeat is still fresh) asks the holder: when the holder's process died, its
connection is gone and with it the subscription, so the server answers at once with "no
responders", and the run is claimed at once instead of after ``attempt_ttl``. Any other
outcome (a reply, a timeout: a frozen process keeps its connection) counts as alive and the
run is left to its heartbeat as before.

Safe when wrong: a takeover only starts a new attempt under the fence; a holder that was in
fact alive finds its heartbeat and complete refused (``StaleAttemptError``), and the new
attempt follows the run's replay policy, exactly as after an expired heartbeat.
"""

from __future__ import annotations

import hashlib

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

__all__ = ["PROBE_TIMEOUT_S", "answer", "is_gone", "liveness_subject"]

PROBE_TIMEOUT_S = 0.5  # a live holder answers within ms; no answer in time = alive (frozen?)


def liveness_subject(namespace: str, worker: str) -> str:
    """``<ns>.live.hands.<digest of the worker name>`` (names may hold any character)."""
    digest = hashlib.blake2b(worker.encode(), digest_size=10).hexdigest()
    return f"{namespace}.live.hands.{digest}"


async def answer(nc: Client, namespace: str, worker: str) -> Subscription:
    """Answer liveness requests for ``worker`` on ``nc`` until the subscription ends."""

    async def reply(msg: Msg) -> None:
        if msg.reply:
            await msg.respond(b"")

    return await nc.subscribe(liveness_subject(namespace, worker), cb=reply)


async def is_gone(nc: Client, namespace: str, worker: str) -> bool:
    """True only when NATS says nobody listens on ``worker``'s subject (its connection is
    gone); False on a reply, a timeout or any error of our own connection."""
    try:
        await nc.request(liveness_subject(namespace, worker), b"", timeout=PROBE_TIMEOUT_S)
    except nats.errors.NoRespondersError:
        return True
    except Exception:  # timeout, our connection reconnecting: assume alive, the ttl decides
        return False
    return False
