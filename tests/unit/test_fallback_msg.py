"""bus.fallback: a message delivered around JetStream reads as a first delivery, and its
acknowledgements do nothing (JetStream delivers the stored message again later)."""

from __future__ import annotations

import pytest

from baton.bus.delivery import delivered, delivered_and_seq
from baton.bus.fallback import FallbackMsg, is_fallback
from baton.bus.messages import carrier_of
from baton.bus.subjects import BusNames
from baton.errors import ValidationError


class _NoWire:
    """A client that fails the test if anything is sent on it."""

    async def publish(self, *args: object, **kwargs: object) -> None:
        raise AssertionError(f"a fallback message sent {args!r} on the wire")


def _copy(seq: int = 0) -> FallbackMsg:
    headers = {"Nats-Msg-Id": "row-1", "Baton-Relay": "relay-1", "Baton-Published-At": "17"}
    return FallbackMsg.of(_NoWire(), "ns.tool.send_email", b"{}", headers,  # type: ignore[arg-type]
                          "NS_TOOLS", seq)


@pytest.mark.parametrize("seq", [0, 42], ids=["relay-copy", "read-from-stream"])
async def test_a_fallback_message_is_a_first_delivery_whose_acks_send_nothing(seq: int) -> None:
    msg = _copy(seq)
    assert is_fallback(msg)
    assert delivered(msg) == 1 and delivered_and_seq(msg) == (1, seq)
    carrier = carrier_of(msg)
    assert carrier is not None
    assert (carrier.relay, carrier.row_id, carrier.stream_seq, carrier.delivery) == (
        "relay-1", "row-1", seq, 1)
    await msg.in_progress()
    assert not msg.is_acked
    for settle in (msg.ack, msg.nak, msg.term):
        await settle()
        assert msg.is_acked


def test_fallback_subjects_stay_in_the_namespace() -> None:
    names = BusNames("ns")
    assert names.fallback_subject("ns.wake.a.1") == "ns.fallback.wake.a.1"
    assert names.fallback_subject(names.tool_subject("send_email")) == \
        "ns.fallback.tool.send_email"
    with pytest.raises(ValidationError):
        names.fallback_subject("other.tool.x")
