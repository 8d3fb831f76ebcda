"""The archive's stores (baton.archive.Archive) against real ones: a local directory, an
S3-compatible server (moto's, see tests/s3_server.py) and obstore's memory store, all through
the same contract; then what only one of them shows (files on disk, a store that is away or
refuses)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from baton.archive import (
    EXTENSION,
    Archive,
    ArchivedSession,
    ArchiveError,
    ArchiveSummary,
    ArchiveUnavailable,
    IndexRow,
    decode,
    encode,
)
from baton.devkit.process import free_port
from baton.errors import CorruptStateError, UnavailableError, ValidationError

HOUR = 3_600_000
#: 2026-01-02 03:00 UTC, the start of an hour.
T0 = 1_767_322_800_000

BACKENDS = ["local", "s3", "memory"]


@pytest.fixture(params=BACKENDS)
def archive_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "archive")
    if request.param == "s3":
        url: str = request.getfixturevalue("s3_url")  # starts moto once per run
        return url
    return "memory:///"


@pytest.fixture
async def archive(archive_url: str) -> AsyncIterator[Archive]:
    async with Archive.from_url(archive_url, timeout_s=10) as a:
        yield a


def session(session_id: str = "s-1", *, namespace: str = "baton", text: str = "hello",
            archived_ms: int = T0) -> ArchivedSession:
    return ArchivedSession(
        namespace=namespace, session_id=session_id, archived_ms=archived_ms, seq=3, fence=1,
        summary=ArchiveSummary(agent="notices", compat=1, status="completed"),
        meta={"agent": "notices", "seq": "3"}, entries=[text],
        receipts=[("1-0", {"kind": "submit"})])


async def test_a_session_object_round_trips(archive: Archive) -> None:
    s = session("s-a:b.c_d-1")
    assert not await archive.exists("baton", s.session_id)
    key = await archive.put("baton", s.session_id, encode(s))
    assert key == f"baton/sessions/s-a:b.c_d-1.json.{EXTENSION}"
    assert await archive.exists("baton", s.session_id)
    data = await archive.get("baton", s.session_id)
    assert data is not None and decode(data) == s
    assert await archive.load("baton", s.session_id) == s
    # Another namespace is another folder.
    assert await archive.get("other", s.session_id) is None


async def test_a_later_write_overwrites(archive: Archive) -> None:
    await archive.save(session(text="first"))
    await archive.save(session(text="second"))
    again = await archive.load("baton", "s-1")
    assert again is not None and again.entries == ["second"]


async def test_an_absent_object_reads_as_none(archive: Archive) -> None:
    assert await archive.get("baton", "s-never") is None
    assert await archive.load("baton", "s-never") is None
    assert not await archive.exists("baton", "s-never")


async def test_delete_removes_the_object_and_deleting_nothing_is_fine(archive: Archive) -> None:
    await archive.save(session())
    await archive.delete("baton", "s-1")
    assert await archive.get("baton", "s-1") is None
    assert not await archive.exists("baton", "s-1")
    await archive.delete("baton", "s-1")


async def test_a_corrupt_object_is_a_clear_error(archive: Archive) -> None:
    await archive.put("baton", "s-bad", b"these bytes are no archive object")
    with pytest.raises(CorruptStateError, match=r"not a zstandard frame.*baton/sessions/s-bad")\
            as caught:
        await archive.load("baton", "s-bad")
    assert caught.value.session_id == "s-bad" and not caught.value.retryable
    # An object that holds another session than its key says.
    await archive.put("baton", "s-2", encode(session("s-1")))
    with pytest.raises(CorruptStateError, match="holds session s-1"):
        await archive.load("baton", "s-2")


async def test_bad_names_are_refused_before_the_store_is_asked(archive: Archive) -> None:
    with pytest.raises(ValidationError, match="invalid session id"):
        await archive.put("baton", "../escape", b"x")
    with pytest.raises(ValidationError, match="invalid namespace"):
        await archive.get("Bad/ns", "s-1")
    with pytest.raises(ValidationError, match="invalid namespace"):
        await archive.list_index("", 0, 1)


async def test_a_closed_archive_refuses_calls(archive: Archive) -> None:
    await archive.close()
    await archive.close()
    with pytest.raises(ArchiveError, match="closed"):
        await archive.get("baton", "s-1")


# ------------------------------------------------------------------------------ the index


def row(session_id: str, archived_ms: int, *, agent: str = "notices",
        status: str = "completed") -> IndexRow:
    return IndexRow(session_id=session_id, agent=agent, status=status, created_ms=1,
                    archived_ms=archived_ms)


async def test_the_index_lists_by_hour_range_and_filters(archive: Archive) -> None:
    # Three hours of archival; the first batch spans two of them.
    keys = await archive.put_index("baton", [
        row("s-a", T0 + 10), row("s-b", T0 + 20, agent="mail"),
        row("s-c", T0 + HOUR + 5, status="failed")])
    assert [k.split("/")[2] for k in keys] == ["2026010203", "2026010204"]
    assert all(k.startswith("baton/index/") and k.endswith(f".jsonl.{EXTENSION}")
               for k in keys)
    await archive.put_index("baton", [row("s-d", T0 + 2 * HOUR + 1), row("s-e", T0 + 30)])
    await archive.put_index("other", [row("s-z", T0 + 1)])

    async def ids(since: int, until: int, **filters: object) -> list[str]:
        rows = await archive.list_index("baton", since, until, **filters)  # type: ignore[arg-type]
        return [r.session_id for r in rows]

    assert await ids(T0, T0 + 3 * HOUR) == ["s-d", "s-c", "s-e", "s-b", "s-a"]  # newest first
    assert await ids(T0, T0 + HOUR) == ["s-e", "s-b", "s-a"]
    assert await ids(T0 + 15, T0 + 30) == ["s-b"]  # [since, until)
    assert await ids(T0 + HOUR, T0 + 2 * HOUR + 2) == ["s-d", "s-c"]
    assert await ids(T0, T0 + 3 * HOUR, agent="mail") == ["s-b"]
    assert await ids(T0, T0 + 3 * HOUR, status="failed") == ["s-c"]
    assert await ids(T0, T0 + 3 * HOUR, agent="notices", status="completed") == [
        "s-d", "s-e", "s-a"]
    assert await ids(T0, T0 + 3 * HOUR, limit=2) == ["s-d", "s-c"]
    assert await ids(T0 - 5 * HOUR, T0) == []
    assert await ids(T0 + HOUR, T0) == []


async def test_a_session_archived_again_is_listed_once(archive: Archive) -> None:
    await archive.put_index("baton", [row("s-a", T0 + 10, status="failed")])
    await archive.put_index("baton", [row("s-a", T0 + HOUR + 10)])
    rows = await archive.list_index("baton", T0, T0 + 2 * HOUR)
    assert rows == [row("s-a", T0 + HOUR + 10)]


async def test_a_listing_reads_only_the_hour_folders_of_its_range(archive: Archive) -> None:
    await archive.put_index("baton", [row("s-a", T0 + 10)])
    # An unreadable object in the next hour's folder: only a listing that reads it fails.
    bad = f"baton/index/2026010204/{T0 + HOUR:013d}-bad.jsonl.{EXTENSION}"
    await archive._put(bad, b"garbage")
    assert [r.session_id for r in await archive.list_index("baton", T0, T0 + HOUR)] == ["s-a"]
    with pytest.raises(CorruptStateError, match=r"index object .*-bad\.jsonl"):
        await archive.list_index("baton", T0, T0 + 2 * HOUR)


async def test_a_listing_span_is_bounded(archive: Archive) -> None:
    with pytest.raises(ValidationError, match="at most 744 hours"):
        await archive.list_index("baton", T0, T0 + 745 * HOUR)


# ------------------------------------------------------------------------------ per backend


async def test_a_local_archive_is_files_under_its_directory(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.chdir(tmp_path)
    relative = Archive.from_url("nested/archive")  # created, resolved against the cwd
    assert (tmp_path / "nested" / "archive").is_dir()
    assert relative.url == str(tmp_path / "nested" / "archive")
    by_url = Archive.from_url(f"file://{tmp_path}/nested/archive")
    key = await relative.save(session())
    on_disk = tmp_path / "nested" / "archive" / key
    assert on_disk.is_file() and decode(on_disk.read_bytes()) == session()
    assert await by_url.load("baton", "s-1") == session()
    with pytest.raises(Exception, match="names no host"):
        Archive.from_url("file://elsewhere/archive")


@pytest.mark.parametrize("url", ["ftp://host/x", "redis://localhost/0", ""])
def test_a_url_of_no_store_is_a_config_error(url: str) -> None:
    from baton.errors import ConfigError

    with pytest.raises(ConfigError):
        Archive.from_url(url)


def s3_at(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    """The AWS_* variables of an S3 store at ``endpoint`` (no server needed to refuse)."""
    for name, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "k",
                        "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1",
                        "AWS_ALLOW_HTTP": "true"}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)


async def test_an_unreachable_store_is_a_retryable_error_within_the_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing listens on the port: every attempt is refused until the deadline.
    s3_at(monkeypatch, f"http://127.0.0.1:{free_port()}")
    archive = Archive.from_url("s3://key-id:sekrit@bucket/prefix?token=sekrit", timeout_s=1)
    assert "sekrit" not in archive.url and "key-id" not in archive.url
    started = time.monotonic()
    async with asyncio.timeout(15):
        with pytest.raises(ArchiveUnavailable) as caught:
            await archive.put("baton", "s-1", b"x")
    assert time.monotonic() - started < 8
    err = caught.value
    assert err.retryable and isinstance(err, UnavailableError) and isinstance(err, ArchiveError)
    assert archive.url in str(err) and "sekrit" not in str(err) and err.operation == "write"
    async with asyncio.timeout(20):
        with pytest.raises(ArchiveUnavailable):
            await archive.get("baton", "s-1")
        with pytest.raises(ArchiveUnavailable):
            await archive.exists("baton", "s-1")
        with pytest.raises(ArchiveUnavailable):
            await archive.list_index("baton", T0, T0 + 1)


async def test_a_store_that_never_answers_is_a_retryable_error_at_the_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    held: list[asyncio.StreamWriter] = []

    async def accept_and_say_nothing(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        held.append(w)

    server = await asyncio.start_server(accept_and_say_nothing, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    s3_at(monkeypatch, f"http://127.0.0.1:{port}")
    try:
        archive = Archive.from_url("s3://bucket/prefix", timeout_s=1)
        async with asyncio.timeout(10):
            with pytest.raises(ArchiveUnavailable, match="no answer within 1 s"):
                await archive.get("baton", "s-1")
    finally:
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()
    assert held  # the request did reach the server


async def test_a_missing_bucket_is_a_terminal_error(s3_url: str) -> None:
    archive = Archive.from_url("s3://no-such-bucket-here/x", timeout_s=10)
    with pytest.raises(ArchiveError, match="no such bucket") as caught:
        await archive.put("baton", "s-1", b"x")
    assert not caught.value.retryable
    with pytest.raises(ArchiveError, match="no such bucket"):
        await archive.get("baton", "s-1")
