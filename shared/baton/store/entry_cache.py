"""The newest entries of the sessions a Brain loaded lately, so its next lease of one reads
only the entries appended since (:meth:`baton.store.store.Store.acquire_and_load`).

A session's entries are an append-only list (commit.lua only pushes), so what a Brain read
at indices ``start..end`` is what any later read finds there: the next acquire asks for the
entries from ``end`` on (``acquire.lua``'s ARGV 6 and 7) and the page is the cached entries
plus those. What is cached is exactly what Redis returned (never the entries a Brain folded
into its state after a commit), under the session's ``created`` ms: the script reads the
whole page for a session opened anew under the same id (a store that lost its state) or a
list shorter than what is cached, and so does this module when what came back does not
continue what it caches.

Bounded by the size of the entries cached in all, as the JSON text Redis returned (the least
recently loaded sessions go first): a page of 200 model outputs or tool results may be
megabytes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["CachedEntries", "EntryCache"]


@dataclass(frozen=True, slots=True)
class CachedEntries:
    """Entries ``start .. start + len(items) - 1`` of a session opened at ``created`` ms, as
    the JSON text Redis returned."""

    created: int
    start: int
    items: tuple[str, ...]

    @property
    def size(self) -> int:
        return sum(map(len, self.items))

    @property
    def end(self) -> int:
        """The index of the first entry not cached."""
        return self.start + len(self.items)


class EntryCache:
    """Cached entries per session id, at most ``max_bytes`` of their text in all (LRU by
    session)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._cached: OrderedDict[str, tuple[CachedEntries, int]] = OrderedDict()
        self._size = 0
        self.reused = 0  # entries a load did not read again (for tests and benchmarks)

    @property
    def size(self) -> int:
        """The text cached in all (characters)."""
        return self._size

    def get(self, session_id: str) -> CachedEntries | None:
        found = self._cached.get(session_id)
        if found is None:
            return None
        self._cached.move_to_end(session_id)
        return found[0]

    def put(self, session_id: str, cached: CachedEntries) -> None:
        self.drop(session_id)
        size = cached.size
        if not cached.items or size > self.max_bytes:
            return
        self._cached[session_id] = (cached, size)
        self._size += size
        while self._size > self.max_bytes:
            _, (_, dropped) = self._cached.popitem(last=False)
            self._size -= dropped

    def drop(self, session_id: str) -> None:
        found = self._cached.pop(session_id, None)
        if found is not None:
            self._size -= found[1]

    def page(self, session_id: str, created: int, count: int, read: list[str],
             page: int) -> tuple[int, list[str]]:
        """The newest ``page`` entries of a session of ``count`` entries, as (index of the
        first, entries), from ``read`` (entries ``count - len(read) .. count - 1``, as
        acquire.lua returned them for what :meth:`get` returned) and what is cached; the
        result is cached in turn."""
        start = count - len(read)
        found = self._cached.get(session_id)
        cached = found[0] if found is not None else None
        items: list[str]
        if cached is not None and cached.created == created and cached.end == start:
            keep = max(0, min(len(cached.items), page - len(read)))
            items = [*cached.items[len(cached.items) - keep:], *read]
            self.reused += keep
            start -= keep
        else:
            items = list(read)
        if created:  # a session not opened yet has nothing to cache
            self.put(session_id, CachedEntries(created, start, tuple(items)))
        return start, items
