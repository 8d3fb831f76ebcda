"""bus.delivery.delivered_and_seq: the numbers nats-py's ``Msg.metadata`` gives, for any reply."""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError

from baton.bus.delivery import delivered, delivered_and_seq

REPLIES = [
    "$JS.ACK.BATON_TOOLS.hands-send_email.1.42.17.1796184288152000000.0",
    "$JS.ACK.S.C.7.123456789012.5.1.3",
    # With a domain and an account hash (12 tokens): nats-py's own parse.
    "$JS.ACK._.ACCHASH.BATON_TOOLS.hands.2.42.17.1796184288152000000.0.token",
    "$JS.ACK.dom.ACCHASH.S.C.3.9.9.1.0.abc",
]


def _msg(reply: str) -> Msg:
    return Msg(None, subject="s", reply=reply, data=b"")  # type: ignore[arg-type]


@pytest.mark.parametrize("reply", REPLIES)
def test_same_numbers_as_nats_py(reply: str) -> None:
    meta = _msg(reply).metadata
    assert delivered_and_seq(_msg(reply)) == (meta.num_delivered, meta.sequence.stream)
    assert delivered(_msg(reply)) == meta.num_delivered


@pytest.mark.parametrize("reply", [
    "", "_INBOX.abc", "$JS.ACK.S.C", "$JS.ACK.S.C.x.1.1.1.1", "$JS.ACK.S.C.\u00b2.1.1.1.1"])
def test_what_is_not_a_jetstream_reply_fails_as_nats_py_does(reply: str) -> None:
    with pytest.raises((NotJSMessageError, ValueError)) as ours:
        delivered_and_seq(_msg(reply))
    with pytest.raises(type(ours.value)):
        _msg(reply).metadata  # noqa: B018
    with pytest.raises(type(ours.value)):
        delivered(_msg(reply))


def test_a_message_without_a_reply_subject_is_read_through_its_metadata() -> None:
    class Meta:
        num_delivered = 4

        class sequence:
            stream = 11

    class Fake:
        metadata = Meta()

    assert delivered_and_seq(Fake()) == (4, 11)
    assert delivered(Fake()) == 4
