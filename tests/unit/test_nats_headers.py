"""bus.parse_header_lines: the same headers as nats-py's own parsing, for any block."""

from __future__ import annotations

import random

from nats.aio.client import Client

from baton.bus.bus import parse_header_lines

BLOCKS = [
    b"",
    b"Nats-Msg-Id: row-1\r\n\r\n",
    b"Nats-Msg-Id: row-1\r\nBaton-Relay: relay-1\r\nBaton-Published: 1764547000000\r\n\r\n",
    b"Name:Value\r\nTabbed:\tvalue \r\n",  # no space after the colon, whitespace around
    b"no colon here\r\nBad Name: x\r\nBad\x1cName: y\r\nGood: z\r\n",  # whitespace in names
    b"\xc3\xa9t\xc3\xa9: non-ascii name\r\nUtf: caf\xc3\xa9 \xff\r\n",  # bad bytes replaced
    b": empty name\r\nDup: one\r\nDup: two\r\nColon: a:b:c\r\n",
    b"Trailing-Space :v\r\n\r\n\r\nAfter-Blank: w",
]


def test_same_headers_as_nats_py() -> None:
    for raw in BLOCKS:
        assert parse_header_lines(raw) == Client._parse_header_lines(raw), raw


def test_same_headers_for_random_blocks() -> None:
    rng = random.Random(15)
    alphabet = b"ab:-_ \t\r\n\x0b\x0c\x1c\x1f\x85\xa0\xc3\xa9\xff0"
    for _ in range(3000):
        raw = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        assert parse_header_lines(raw) == Client._parse_header_lines(raw), raw
