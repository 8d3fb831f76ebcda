"""The bundled mail service: idempotent sends, query by operation id, durability, delay window."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from baton.devkit.mailbox import MailboxServer, serve_mailbox

REPO_ROOT = Path(__file__).resolve().parents[2]
MAIL = {"to": "ada@example.com", "subject": "Notice", "body": "Service window on Sunday."}


def _key() -> str:
    return f"op-{uuid.uuid4().hex}"


@pytest.fixture
async def mailbox() -> AsyncIterator[MailboxServer]:
    async with MailboxServer() as server:
        yield server


@pytest.fixture
async def client(mailbox: MailboxServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=mailbox.url, timeout=10) as c:
        yield c


async def _send(client: httpx.AsyncClient, key: str, **headers: str) -> httpx.Response:
    return await client.post("/send", json=MAIL, headers={"Idempotency-Key": key, **headers})


async def test_send_delivers_and_records(client: httpx.AsyncClient) -> None:
    key = _key()
    resp = await _send(client, key)
    assert resp.status_code == 200
    op = resp.json()
    assert op["operation_id"] == key
    assert op["status"] == "delivered"
    assert op["to"] == MAIL["to"]
    assert op["message_id"] and op["delivered_at"]
    assert op["duplicate"] is False

    found = await client.get(f"/operations/{key}")
    assert found.status_code == 200
    assert found.json()["message_id"] == op["message_id"]


async def test_same_key_is_suppressed_and_counted(client: httpx.AsyncClient) -> None:
    key = _key()
    first = (await _send(client, key)).json()
    again = await _send(client, key)
    assert again.status_code == 200
    assert again.json() == {**first, "duplicate": True}

    stats = (await client.get("/stats")).json()
    assert stats["raw_requests"] == 2
    assert stats["accepted"] == 1
    assert stats["duplicates_suppressed"] == 1
    assert stats["deliveries"] == {MAIL["to"]: 1}
    assert stats["repeated_keys"] == {key: 1}


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "data-dir"])
async def test_concurrent_same_key_delivers_once(durable: bool, tmp_path: Path) -> None:
    # With a data dir the record is written (and fsync'd) off the event loop, so the racing
    # requests really interleave between the check and the write.
    async with (
        MailboxServer(data_dir=tmp_path if durable else None) as server,
        httpx.AsyncClient(base_url=server.url, timeout=10) as client,
    ):
        key = _key()
        replies = await asyncio.gather(*(_send(client, key) for _ in range(20)))
        bodies = [r.json() for r in replies]
        assert {r.status_code for r in replies} == {200}
        assert len({b["message_id"] for b in bodies}) == 1
        assert sum(not b["duplicate"] for b in bodies) == 1

        stats = (await client.get("/stats")).json()
        assert (stats["raw_requests"], stats["accepted"], stats["duplicates_suppressed"]) == (
            20,
            1,
            19,
        )
    if durable:
        assert len((tmp_path / "operations.jsonl").read_text().splitlines()) == 1


async def test_bad_requests_are_rejected(client: httpx.AsyncClient) -> None:
    missing = await client.post("/send", json=MAIL)
    assert missing.status_code == 400
    assert missing.json()["error"] == "missing_idempotency_key"

    bad_body = await client.post(
        "/send", json={"to": "x@example.com"}, headers={"Idempotency-Key": _key()}
    )
    assert bad_body.status_code == 400
    assert bad_body.json()["error"] == "invalid_body"

    bad_delay = await _send(client, _key(), **{"X-Delay-Ms": "soon"})
    assert bad_delay.status_code == 400
    assert bad_delay.json()["error"] == "invalid_delay"

    stats = (await client.get("/stats")).json()
    assert stats["accepted"] == 0
    assert stats["rejected"] == 3


async def test_unknown_operation_is_404(client: httpx.AsyncClient) -> None:
    resp = await client.get(f"/operations/{_key()}")
    assert resp.status_code == 404
    assert resp.json() == {"error": "not_found"}


async def test_stats_count_deliveries_per_recipient(client: httpx.AsyncClient) -> None:
    for to in ["a@example.com", "b@example.com", "a@example.com"]:
        resp = await client.post(
            "/send", json={**MAIL, "to": to}, headers={"Idempotency-Key": _key()}
        )
        assert resp.status_code == 200
    stats = (await client.get("/stats")).json()
    assert stats["accepted"] == 3
    assert stats["deliveries"] == {"a@example.com": 2, "b@example.com": 1}


async def test_health_and_reset(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"ok": True}
    key = _key()
    await _send(client, key)
    assert (await client.post("/reset")).status_code == 200
    assert (await client.get(f"/operations/{key}")).status_code == 404
    stats = (await client.get("/stats")).json()
    assert stats == {
        "raw_requests": 0,
        "accepted": 0,
        "duplicates_suppressed": 0,
        "rejected": 0,
        "deliveries": {},
        "repeated_keys": {},
        "held": 0,
        "in_flight": 0,
        "max_in_flight": 0,
    }


async def test_operations_survive_restart(tmp_path: Path) -> None:
    key = _key()
    async with MailboxServer(data_dir=tmp_path) as first:
        async with httpx.AsyncClient(base_url=first.url) as c:
            original = (await _send(c, key)).json()

    async with MailboxServer(data_dir=tmp_path) as second:
        async with httpx.AsyncClient(base_url=second.url) as c:
            found = await c.get(f"/operations/{key}")
            assert found.status_code == 200
            assert found.json()["message_id"] == original["message_id"]

            again = (await _send(c, key)).json()
            assert again["duplicate"] is True
            assert again["message_id"] == original["message_id"]
            stats = (await c.get("/stats")).json()
            assert stats["accepted"] == 1
            assert stats["deliveries"] == {MAIL["to"]: 1}


async def test_torn_last_line_is_dropped_on_load(tmp_path: Path) -> None:
    key = _key()
    async with MailboxServer(data_dir=tmp_path) as server:
        async with httpx.AsyncClient(base_url=server.url) as c:
            await _send(c, key)
    with (tmp_path / "operations.jsonl").open("a") as f:
        f.write('{"schema_version": 1, "operation_id": "torn')  # a crash mid-append

    async with MailboxServer(data_dir=tmp_path) as server:
        assert list(server.operations) == [key]
        async with httpx.AsyncClient(base_url=server.url) as c:
            later = _key()
            assert (await _send(c, later)).status_code == 200

    # The torn tail was cut off, so the later append is a line of its own.
    async with MailboxServer(data_dir=tmp_path) as server:
        assert list(server.operations) == [key, later]


async def test_delay_holds_reply_after_recording() -> None:
    """The crash window: the send is already recorded and visible while its reply is held."""
    async with MailboxServer(delay_ms=60_000) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as c:
            key = _key()
            post = asyncio.create_task(_send(c, key, **{"X-Delay-Ms": "1500"}))
            async with asyncio.timeout(5):
                while (await c.get(f"/operations/{key}")).status_code != 200:
                    assert not post.done(), post
            assert not post.done()

            # A retry during the window is answered at once, as a duplicate.
            retry = await _send(c, key)
            assert retry.json()["duplicate"] is True
            assert not post.done()

            reply = await post
            assert reply.status_code == 200
            assert reply.json()["duplicate"] is False

            # The server-wide delay applies unless a request overrides it.
            fast = await _send(c, _key(), **{"X-Delay-Ms": "0"})
            assert fast.status_code == 200


async def test_hold_keeps_answers_until_release() -> None:
    """While held, sends are recorded and counted as held; release answers them all."""
    async with MailboxServer() as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as c:
            assert (await c.post("/hold")).status_code == 200
            keys = [_key() for _ in range(3)]
            posts = [asyncio.create_task(_send(c, k)) for k in keys]
            async with asyncio.timeout(5):
                while (await c.get("/stats")).json()["held"] < 3:
                    pass
            stats = (await c.get("/stats")).json()
            assert stats["accepted"] == 3 and not any(p.done() for p in posts)
            # A duplicate and a confirm query are answered while held.
            assert (await _send(c, keys[0])).json()["duplicate"] is True
            assert (await c.get(f"/operations/{keys[1]}")).status_code == 200

            assert (await c.post("/release")).json()["released"] == 3
            replies = await asyncio.gather(*posts)
            assert [r.json()["duplicate"] for r in replies] == [False] * 3
            assert (await c.get("/stats")).json()["held"] == 0


async def test_command_prints_url_and_stops_on_sigterm(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "baton.devkit.mailbox",
        "--port",
        "0",
        "--data",
        str(tmp_path / "mail"),
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(15):
            line = (await proc.stdout.readline()).decode()
        match = re.search(r"http://\S+", line)
        assert match, line
        async with httpx.AsyncClient(base_url=match.group(0)) as c:
            assert (await c.get("/healthz")).json() == {"ok": True}
            assert (await _send(c, _key())).status_code == 200
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10):
            assert await proc.wait() == 0
        assert len((tmp_path / "mail" / "operations.jsonl").read_text().splitlines()) == 1
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_serve_mailbox_runs_until_cancelled() -> None:
    ready = asyncio.Event()
    urls: list[str] = []
    task = asyncio.create_task(serve_mailbox(0, 0, None, ready=ready, on_ready=urls.append))
    try:
        async with asyncio.timeout(5):
            await ready.wait()
        async with httpx.AsyncClient(base_url=urls[0]) as c:
            assert (await c.get("/healthz")).json() == {"ok": True}
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
