"""What a JetStream message's reply subject says of its delivery, read with one split.

nats-py's ``Msg.metadata`` parses the whole reply subject into a dataclass with a
``datetime`` and two more objects (about 7 µs a message); a worker reads two numbers of it
for every message it handles. This module imports nothing, so the telemetry wrappers read
the same numbers the same way without loading the bus.
"""

from __future__ import annotations

from typing import Any

__all__ = ["delivered", "delivered_and_seq"]

_PREFIX = "$JS.ACK."
#: ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts ns>.<pending>``,
#: the reply subject a server without a JetStream domain sends; others (with a domain and an
#: account hash in front) go through ``Msg.metadata``.
_V1_TOKENS = 9
_DELIVERED, _STREAM_SEQ = 4, 5


def _v1_tokens(msg: Any) -> list[str] | None:
    reply = getattr(msg, "reply", None)
    if type(reply) is str and reply.startswith(_PREFIX):
        tokens = reply.split(".")
        if (len(tokens) == _V1_TOKENS and tokens[_DELIVERED].isdecimal()
                and tokens[_STREAM_SEQ].isdecimal()):
            return tokens
    return None


def delivered(msg: Any) -> int:
    """How many times JetStream has delivered ``msg``: 1 on its first delivery.

    Raises as ``msg.metadata`` does (``NotJSMessageError``) for a message that is not one.
    """
    tokens = _v1_tokens(msg)
    return int(tokens[_DELIVERED]) if tokens else int(msg.metadata.num_delivered)


def delivered_and_seq(msg: Any) -> tuple[int, int]:
    """(times delivered, stream sequence) of a JetStream message, raising as :func:`delivered`."""
    tokens = _v1_tokens(msg)
    if tokens:
        return int(tokens[_DELIVERED]), int(tokens[_STREAM_SEQ])
    meta = msg.metadata
    return int(meta.num_delivered), int(meta.sequence.stream)
