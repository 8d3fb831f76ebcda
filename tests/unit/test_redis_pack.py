"""The connection's fast command packing writes exactly what redis-py's own would."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.connection import Connection

from baton.store.redis_client import SafeConnection

CASES: list[tuple[Any, ...]] = [
    ("PING",),
    ("EVALSHA", "abc123", 1, "ns:{ns-1}:s:x:meta", "", 5, -3, 0, "é ünïcode ✓", b"\x00raw"),
    ("HSET", "k", "f", "x" * 10_000, "g", ""),  # over the buffer cutoff: chunked there
    ("SCRIPT LOAD", "return 1"),  # a two-word command name: the library's way
    ("SET", "k", 1.5),  # a float: the library's way
    ("SET", "k", bytearray(b"v")),
]


@pytest.mark.parametrize("args", CASES)
def test_fast_packing_matches_redis_py(args: tuple[Any, ...]) -> None:
    fast, plain = SafeConnection(), Connection()
    assert b"".join(fast.pack_command(*args)) == b"".join(plain.pack_command(*args))


def test_a_repeated_command_is_packed_once_and_sent_the_same() -> None:
    args = ("XREADGROUP", "GROUP", "relay", "r-1", "COUNT", 256, "BLOCK", 5000, "STREAMS",
            "ns:{ns-0}:outbox", "ns:{ns-0}:wakes", ">", ">")
    fast, plain = SafeConnection(), Connection()
    first, again = fast.pack_command(*args), fast.pack_command(*args)
    assert b"".join(first) == b"".join(again) == b"".join(plain.pack_command(*args))
    unhashable = ("XREADGROUP", "GROUP", "relay", bytearray(b"r-1"), "STREAMS", "k", ">")
    assert b"".join(fast.pack_command(*unhashable)) == b"".join(plain.pack_command(*unhashable))
