"""The bench's plain in-process loop (baton.bench.plain_loop), the baseline every ratio divides
by: beside durable servers its log is durable too, each step on disk before the next is
written, with the lines of one loop turn sharing an fsync (a group commit)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import orjson
import pytest

from baton.bench import plain_loop
from baton.bench.sessions import FIVE
from baton.devkit.mailbox import MailboxServer


def _recording(monkeypatch: pytest.MonkeyPatch, log_path: Path) -> list[tuple[str, int]]:
    """Record each fsync of the log with the log's size then; the real fsync still runs."""
    events: list[tuple[str, int]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        real(fd)
        events.append(("fsync", log_path.stat().st_size))

    monkeypatch.setattr(plain_loop.os, "fsync", fsync)
    return events


async def _sessions(mailbox: MailboxServer, path: Path, n: int, *,
                    fsync: bool) -> plain_loop.PlainLoop:
    """Run ``n`` concurrent sessions of the plain loop logging to ``path``."""
    with path.open("ab") as log:
        loop = plain_loop.PlainLoop(mailbox.url, log, fsync=fsync)
        try:
            await asyncio.gather(*(loop.session(FIVE) for _ in range(n)))
        finally:
            await loop.close()
    return loop


async def test_each_step_is_fsynced_before_the_next_is_written(
        mailbox: MailboxServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "log.jsonl"
    events = _recording(monkeypatch, path)
    loop = await _sessions(mailbox, path, 1, fsync=True)
    lines = path.read_bytes().splitlines(keepends=True)
    steps = [orjson.loads(line)["step"] for line in lines]
    assert steps == ["input", "model", *["tool"] * 5, "final"]
    ends = [sum(len(x) for x in lines[:i + 1]) for i in range(len(lines))]
    synced = [size for _, size in events]
    assert synced == sorted(synced) and synced[-1] == ends[-1] and loop.fsyncs == len(events)
    # the input, the model turn and the final answer follow one another: each was on disk
    # (an fsync covered its end) before the next line was written
    for before in (0, 1, 6):
        assert any(ends[before] <= size < ends[before + 1] for size in synced), steps[before]


async def test_steps_of_one_loop_turn_share_an_fsync(
        mailbox: MailboxServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "log.jsonl"
    events = _recording(monkeypatch, path)
    loop = await _sessions(mailbox, path, 8, fsync=True)
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) == 8 * 8 and events[-1][1] == path.stat().st_size
    # the eight sessions' input lines were written in one loop turn: one fsync for them all
    assert [orjson.loads(line)["step"] for line in lines[:8]] == ["input"] * 8
    assert events[0][1] == sum(len(line) for line in lines[:8])
    assert loop.fsyncs < len(lines)


async def test_without_fsync_the_log_is_only_flushed(
        mailbox: MailboxServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "log.jsonl"
    events = _recording(monkeypatch, path)
    loop = await _sessions(mailbox, path, 1, fsync=False)
    assert len(path.read_bytes().splitlines()) == 8 and events == [] and loop.fsyncs == 0
