"""The newest entries of the sessions a Brain loaded lately, so its next lease of one reads
only the entries appended since (:meth:`baton.store.store.Store.acquire_and_load`).

A session's entries are an append-only list (commit.lua only pushes), so what a Brain read
at indices ``start..end`` is what any later read finds there: the next acquire asks for the
entries from ``end`` on (``acquire.lua``'s ARGV 6 and 7) and the page is the held entries
plus those. What is held is exactly what Redis returned (never the entries a Brain folded
into its state after a commit), under the session's ``created`` ms: the script reads the
whole page for a session opened anew under the same id (a store that lost its state) or a
list shorter than what is held, and so does this module when what came back does not
continue what it holds.

Bounded by the size of the entries held in all, as the JSON text Redis returned (the least
recently loaded sessions go first): a page of 200 model outputs or tool results may be
megabytes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["EntryCache", "HeldEntries"]


@dataclass(frozen=True, slots=True)
class HeldEntries:
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
        """The index of the first entry not held."""
        return self.start + len(self.items)


class EntryCache:
    """Held entries per session id, at most ``max_bytes`` of their text in all (LRU by
    session)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._held: OrderedDict[str, tuple[HeldEntries, int]] = OrderedDict()
        self._size = 0
        self.reused = 0  # entries a load did not read again (for tests and benchmarks)

    @property
    def size(self) -> int:
        """The text held in all (characters)."""
        return self._size

    def get(self, session_id: str) -> HeldEntries | None:
        found = self._held.get(session_id)
        if found is None:
            return None
        self._held.move_to_end(session_id)
        return found[0]

    def put(self, session_id: str, held: HeldEntries) -> None:
        self.drop(session_id)
        size = held.size
        if not held.items or size > self.max_bytes:
            return
        self._held[session_id] = (held, size)
        self._size += size
        while self._size > self.max_bytes:
            _, (_, dropped) = self._held.popitem(last=False)
            self._size -= dropped

    def drop(self, session_id: str) -> None:
        found = self._held.pop(session_id, None)
        if found is not None:
            self._size -= found[1]

    def page(self, session_id: str, created: int, count: int, read: list[str],
             page: int) -> tuple[int, list[str]]:
        """The newest ``page`` entries of a session of ``count`` entries, as (index of the
        first, entries), from ``read`` (entries ``count - len(read) .. count - 1``, as
        acquire.lua returned them for what :meth:`get` held) and what is held; the result
        is held in turn."""
        start = count - len(read)
        found = self._held.get(session_id)
        held = found[0] if found is not None else None
        items: list[str]
        if held is not None and held.created == created and held.end == start:
            keep = max(0, min(len(held.items), page - len(read)))
            items = [*held.items[len(held.items) - keep:], *read]
            self.reused += keep
            start -= keep
        else:
            items = list(read)
        if created:  # a session not opened yet has nothing to hold
            self.put(session_id, HeldEntries(created, start, tuple(items)))
        return start, items
