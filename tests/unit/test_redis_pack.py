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
