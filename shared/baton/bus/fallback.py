"""Delivery around a stream or consumer that has lost its leader.

Each JetStream stream and each durable consumer is a Raft group. When the NATS node leading
one dies, the survivors elect another only after their election timeout, 4 to 9 s, fixed in
nats-server. Until then the stream refuses every publish (503) and the consumer delivers
nothing, so without a way around, every session with work on that stream or consumer stalls
for the election. Two ways around, both copies of messages JetStream keeps or will keep:

* **the stream cannot take a message**: the relay publishes it anyway, with the same
  ``Nats-Msg-Id`` and headers, as core NATS on its fallback subject
  (:meth:`~baton.bus.subjects.BusNames.fallback_subject`, ``ns.fallback.tool.<tool>``), to
  one worker of the queue group named after the consumer, which answers that it took it (a
  copy nobody took, sent while the workers were reconnecting, say, goes again with the next
  try); the outbox row stays pending and the relay keeps publishing it to the stream until
  the stream takes it (:mod:`baton.relay.publisher`).
* **the consumer cannot deliver**: a worker whose pull request goes unanswered (no idle
  heartbeat from the consumer) or is refused (503: no leader) reads the consumer's subject
  from the stream itself, with direct gets that every replica answers (``allow_direct``),
  until the consumer answers again (:class:`~baton.bus.pull.Puller`).

A message that comes around JetStream is a :class:`FallbackMsg`: its ack, nak, term and
in-progress are no-ops, since JetStream delivers the stored message again once a leader is
elected. That second delivery, and the copies several workers read alike, are duplicates
that change nothing: who may act on a message is decided by the fences in Redis (a run's
claim, a session's lease), never by delivery. A copy that is lost (a worker stopping, a
full queue) costs only the wait for the stored message.
"""

from __future__ import annotations

import datetime

from nats.aio.client import Client
from nats.aio.msg import Msg

__all__ = ["FallbackMsg", "is_fallback"]


class FallbackMsg(Msg):
    """A message delivered around JetStream: acknowledging it does nothing.

    Its metadata says delivery 1 and the stream sequence it was read at (0 for a relay's
    copy, which no stream holds yet), so the workers' receipts and logs read as usual.
    """

    _fallback_metadata: Msg.Metadata
    _settled: bool

    @classmethod
    def of(cls, nc: Client, subject: str, data: bytes, headers: dict[str, str] | None,
           stream: str, seq: int = 0) -> FallbackMsg:
        msg = cls(nc, subject, "", data, headers)
        msg._fallback_metadata = Msg.Metadata(
            sequence=Msg.Metadata.SequencePair(consumer=0, stream=seq), num_pending=0,
            num_delivered=1, timestamp=datetime.datetime.now(datetime.UTC), stream=stream,
            consumer="fallback")
        msg._settled = False
        return msg

    @property
    def metadata(self) -> Msg.Metadata:
        return self._fallback_metadata

    @property
    def is_acked(self) -> bool:
        return self._settled

    async def ack(self) -> None:
        self._settled = True

    async def ack_sync(self, timeout: float = 1.0) -> Msg:  # noqa: ASYNC109
        self._settled = True
        return self

    async def nak(self, delay: int | float | None = None) -> None:
        self._settled = True

    async def in_progress(self) -> None:
        return None

    async def term(self) -> None:
        self._settled = True


def is_fallback(msg: Msg) -> bool:
    """Whether ``msg`` came around JetStream (its stored copy is delivered later)."""
    return isinstance(msg, FallbackMsg)
