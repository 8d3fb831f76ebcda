"""Which archival times a listing of archived sessions reads from the archive's index
(baton.store.archived.index_range_of): older than the tombstones' window, within the asked
range, never more hour folders than Archive.list_index reads."""

from __future__ import annotations

from baton.archive import MAX_INDEX_HOURS
from baton.store.archived import INDEX_HOURS, index_range_of

HOUR = 3_600_000
NOW = 1_800_000_000_000  # a whole hour
DAY_S = 86_400.0
OVERLAP = 60_000


def test_without_a_range_it_reads_a_day_before_the_tombstones_window() -> None:
    window = NOW - 7 * 24 * HOUR + OVERLAP
    assert index_range_of(None, None, 7 * DAY_S, NOW) == (window - INDEX_HOURS * HOUR, window)


def test_a_range_is_cut_at_the_window_and_until_is_inclusive() -> None:
    window = NOW - 24 * HOUR + OVERLAP
    assert index_range_of(NOW - 30 * HOUR, None, DAY_S, NOW) == (NOW - 30 * HOUR, window)
    assert index_range_of(NOW - 30 * HOUR, NOW - 28 * HOUR, DAY_S, NOW) == (
        NOW - 30 * HOUR, NOW - 28 * HOUR + 1)


def test_a_range_inside_the_window_reads_nothing_from_the_index() -> None:
    assert index_range_of(NOW - HOUR, None, DAY_S, NOW) is None
    assert index_range_of(None, NOW - 30 * 24 * HOUR, DAY_S, NOW) is not None


def test_a_long_range_reads_the_newest_hour_folders_only() -> None:
    since, until = index_range_of(0, None, DAY_S, NOW) or (0, 0)
    first, last = since // HOUR, (until - 1) // HOUR
    assert last - first + 1 == MAX_INDEX_HOURS
    assert until == NOW - 24 * HOUR + OVERLAP
