"""An event stream's queue is bounded in bytes, not only in changes: a stream that falls a
few large changes behind is ended (its client resumes with Last-Event-ID), and admission
counts each caller's streams. baton.api.events, without a server."""

from __future__ import annotations

from baton.api.events import MAX_BEHIND, Watchers, _Stream


def test_a_stream_is_ended_past_its_bytes_not_only_past_a_count() -> None:
    stream = _Stream((0, 0), limit=100)
    stream.put("a" * 60)
    assert not stream.ended
    stream.put("b" * 60)  # 120 bytes queued would be over 100: ended instead
    assert stream.ended
    assert stream.taken(stream.queue.get_nowait()) == "a" * 60
    assert stream.taken(stream.queue.get_nowait()) is None  # the end, nothing after
    assert stream.queue.empty() and stream.queued == 0
    # Bytes, not characters: each of these is two bytes in UTF-8.
    wide = _Stream((0, 0), limit=100)
    wide.put("é" * 60)
    assert wide.ended
    # A count still bounds many small changes.
    many = _Stream((0, 0), limit=10**9)
    for _ in range(MAX_BEHIND + 1):
        many.put("x")
    assert many.ended


def test_admission_counts_each_caller_and_all() -> None:
    watchers = Watchers(max_streams=3, max_per_caller=2)
    a1, a2 = watchers.admit("a"), watchers.admit("a")
    assert a1 is not None and a2 is not None
    assert watchers.admit("a") is None  # its own cap
    b1 = watchers.admit("b")
    assert b1 is not None
    assert watchers.admit("c") is None  # the total
    a1.release()
    a1.release()  # idempotent
    assert watchers.open == 2 and watchers.by_caller["a"] == 1
    assert watchers.admit("c") is not None
