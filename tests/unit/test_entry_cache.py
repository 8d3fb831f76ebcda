"""The entry cache's bounds and merging, as pure logic (the reads are tested against Redis in
tests/integration/test_entry_cache.py)."""

from __future__ import annotations

from baton.store.entry_cache import CachedEntries, EntryCache


def test_the_least_recently_leased_sessions_go_first_past_the_bound() -> None:
    """The bound is the text held (an entry's JSON), not the number of entries."""
    cache = EntryCache(10)
    cache.put("a", CachedEntries(1, 0, ("a0", "a1")))
    cache.put("b", CachedEntries(1, 0, ("b0", "b1")))
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("c", CachedEntries(1, 0, ("c0", "c1")))
    assert cache.get("b") is None and cache.get("a") is not None and cache.size == 8
    cache.put("big", CachedEntries(1, 0, ("x" * 11,)))  # larger than the bound: not held
    assert cache.get("big") is None and cache.size == 8
    # held anew: its old size is given back, and c, now the oldest, goes to make room
    cache.put("a", CachedEntries(1, 0, ("a0" * 4,)))
    assert cache.get("c") is None and cache.get("a") is not None and cache.size == 8


def test_a_page_continues_what_is_held_and_keeps_the_newest() -> None:
    cache = EntryCache(100)
    assert cache.page("s", 7, 3, ["e0", "e1", "e2"], page=4) == (0, ["e0", "e1", "e2"])
    # two new entries read from index 3 on: the page is the newest four
    assert cache.page("s", 7, 5, ["e3", "e4"], page=4) == (1, ["e1", "e2", "e3", "e4"])
    assert cache.reused == 2
    # four new entries fill the page: none of those held is kept
    assert cache.page("s", 7, 9, ["e5", "e6", "e7", "e8"], page=4) == (
        5, ["e5", "e6", "e7", "e8"])
    # another life of the session (created differs): nothing held is used
    assert cache.page("s", 8, 10, ["f9"], page=4) == (9, ["f9"])
    assert cache.reused == 2
    # a session not opened yet (created 0) is not held
    cache.page("new", 0, 1, ["n0"], page=4)
    assert cache.get("new") is None
