"""The connection's fast command packing writes exactly what redis-py's own would."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.connection import Connection

from baton.store import redis_wire
from baton.store.redis_client import SafeConnection

CASES: list[tuple[Any, ...]] = [
    ("PING",),
    ("EVALSHA", "abc123", 1, "ns:{ns-1}:s:x:meta", "", 5, -3, 0, "é ünïcode ✓", b"\x00raw"),
    ("HSET", "k", "f", "x" * 10_000, "g", ""),  # over the buffer cutoff: chunked there
    ("SCRIPT LOAD", "return 1"),  # a two-word command name: the library's way
    ("SET", "k", 1.5),
    ("ZADD", "k", 0.1, "a", -0.0, "b", 1e20, "c", float("inf"), "d", 2**70, "e"),
    ("SET", "k", memoryview(b"view")),
    ("SET", "k", bytearray(b"v")),  # refused by the C packer: the library's way
]
REFUSED: list[tuple[Any, ...]] = [
    ("SET", "k", True),
    ("SET", "k", None),
    ("SET", "k", "\ud800"),  # a lone surrogate: not UTF-8
]


@pytest.fixture(params=["hiredis", "python"])
def packer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of packing: hiredis' C packer, and the loop used without hiredis."""
    if request.param == "python":
        monkeypatch.setattr(redis_wire, "_hiredis_pack", None)
    else:
        assert redis_wire._hiredis_pack is not None  # redis[hiredis] is a dependency
    return str(request.param)


@pytest.mark.parametrize("args", CASES)
def test_fast_packing_matches_redis_py(args: tuple[Any, ...], packer: str) -> None:
    fast, plain = SafeConnection(), Connection()
    assert b"".join(fast.pack_command(*args)) == b"".join(plain.pack_command(*args))


@pytest.mark.parametrize("args", REFUSED)
def test_what_redis_py_refuses_is_refused_with_its_error(args: tuple[Any, ...],
                                                       packer: str) -> None:
    fast, plain = SafeConnection(), Connection()
    with pytest.raises(Exception) as expected:
        plain.pack_command(*args)
    with pytest.raises(type(expected.value)):
        fast.pack_command(*args)


def test_a_repeated_command_is_packed_once_and_sent_the_same() -> None:
    args = ("XREADGROUP", "GROUP", "relay", "r-1", "COUNT", 256, "BLOCK", 5000, "STREAMS",
            "ns:{ns-0}:outbox", "ns:{ns-0}:wakes", ">", ">")
    fast, plain = SafeConnection(), Connection()
    first, again = fast.pack_command(*args), fast.pack_command(*args)
    assert b"".join(first) == b"".join(again) == b"".join(plain.pack_command(*args))
    unhashable = ("XREADGROUP", "GROUP", "relay", bytearray(b"r-1"), "STREAMS", "k", ">")
    assert b"".join(fast.pack_command(*unhashable)) == b"".join(plain.pack_command(*unhashable))
