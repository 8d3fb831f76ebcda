"""Reads fall through to the archive (baton.store.archived): every reader answers for an
archived session what it answered while Redis held it, marked archived, against real Redis and
NATS, a real archive directory, the CLI as a child process and the API served in this loop.

One notice-batch session (a task with five children and their tool runs, two documents, then
a submission) runs on the Brain, Hands and relay of this event loop; they stop, the session's
retention is made due and a test worker takes its lease, as the Brain that archives it does.
Every reader reads it then, the session is archived under that lease
(``retention.archive_if_due``), and every reader reads it again. The two answers may differ
only in the archived marker, and in what the archival itself changed: the lease ended, the
retention timer went. Then the tombstone goes (as it expires) and the archive is asked by id.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import pytest

from baton.api.auth import Tokens
from baton.archive import Archive
from baton.cli.watch import Watch
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.devkit.servers import NatsServer, RedisServer
from baton.errors import NotFoundError
from baton.examples.notice_batch import PLAN, SUMMARY, app
from baton.models import Submission, Terminal, WorkerRef
from baton.settings import Settings
from baton.store import retention
from baton.store.archived import ArchivedReads
from baton.store.store import Store, now_ms
from baton.store.writes import Writes
from tests.api_helpers import SseReader, serving_api
from tests.conftest import TOPOLOGIES
from tests.helpers import eventually, running, take_up, trio

pytestmark = pytest.mark.timeout(300)

RECIPIENTS = ["ada@example.com", "grace@example.com", "linus@example.com"]
ME = WorkerRef(role="brain", name="brain-archiver", pid=0)
TOKEN = "read-token-0123456789"
READ = {"Authorization": f"Bearer {TOKEN}"}


def _tokens() -> Tokens:
    return Tokens(Tokens.parse(f"read:{TOKEN}", "test"))


@dataclass
class Reading:
    """What every reader answered for the session at one moment."""

    client: dict[str, Any] = field(default_factory=dict)
    cli: dict[str, Any] = field(default_factory=dict)
    api: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass
class Archived:
    settings: Settings
    home: Path
    sid: str
    task_id: str
    sub: Submission
    archived_ms: int
    before: Reading
    after: Reading
    #: the items a watch that followed the session while it was archived emitted
    watched: list[dict[str, Any]]
    #: the SSE events a stream open while it was archived sent, to its end
    streamed: list[tuple[str, dict[str, Any]]]
    #: the readings once its tombstone is gone (the archive asked by id)
    expired: Reading
    #: a session that never existed, as each reader answers (the archive asked too)
    missing: dict[str, Any]


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "baton", *args], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**os.environ, "BATON_DEBUG": "", **env})


async def _cli_json(env: dict[str, str], *args: str) -> list[Any]:
    done = await asyncio.to_thread(_cli, env, *args, "--json")
    assert done.returncode == 0, f"baton {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


async def _events(http: httpx.AsyncClient, sid: str) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events of the session up to its snapshot, then, when it is archived, to the
    stream's end."""
    seen: list[tuple[str, dict[str, Any]]] = []
    async with http.stream("GET", f"/v1/sessions/{sid}/events", headers=READ) as stream:
        assert stream.status_code == 200
        reader = SseReader(stream)
        while True:
            try:
                event, data, _ = await reader.next()
            except EOFError:
                return seen
            seen.append((event, data))
            if event == "snapshot" and not data["archived"]:
                return seen  # a live session's stream goes on: the snapshot is enough


async def _read_everything(settings: Settings, env: dict[str, str], http: httpx.AsyncClient,
                           sid: str, task_id: str, sub: Submission) -> Reading:
    out = Reading()
    async with Client.connect(settings) as client:
        out.client = {
            "wait": await client.wait(sub, timeout=30),
            "task": await client.task(sid, task_id),
            "wait_task": await client.wait_task(sid, task_id, timeout=30),
            "document": await client.document(sid, PLAN),
            "summary": await client.document(sid, SUMMARY),
            "approvals": await client.awaiting_approval(sid),
            "cancelled": await client.wait_cancelled(sid, timeout=30),
            "archival": await client.archival(sid),
        }
    out.cli = {
        "trace": (await _cli_json(env, "trace", sid))[0],
        "inspect": (await _cli_json(env, "inspect", sid))[0],
        "watch": await _cli_json(env, "watch", sid, "--until-settled"),
    }
    events = out.cli["trace"]["events"]
    out.cli["watch_from"] = await _cli_json(  # resumed after its first third
        env, "watch", sid, "--from", events[len(events) // 3]["stream_id"], "--until-settled")
    trace_text = await asyncio.to_thread(_cli, env, "trace", sid)
    inspect_text = await asyncio.to_thread(_cli, env, "inspect", sid)
    out.cli["trace_text"], out.cli["inspect_text"] = trace_text.stdout, inspect_text.stdout
    base = f"/v1/sessions/{sid}"
    for name, path in (("detail", base), ("entries", f"{base}/entries"),
                       ("trace", f"{base}/trace"), ("plan", f"{base}/documents/{PLAN}"),
                       ("submission", f"{base}/submissions/{sub.id}"),
                       ("task", f"{base}/tasks/{task_id}")):
        r = await http.get(path, headers=READ)
        assert r.status_code == 200, (path, r.text)
        out.api[name] = r.json()
        out.headers[name] = dict(r.headers)
    out.api["events"] = await _events(http, sid)
    return out


async def _listings(http: httpx.AsyncClient, archived_ms: int) -> dict[str, list[str]]:
    """The ids each filtered listing answers."""
    queries = {
        "all": {}, "agent": {"agent": "notice-batch"}, "other_agent": {"agent": "notices"},
        "status_archived": {"status": "archived"}, "completed": {"status": "completed"},
        "failed": {"status": "failed"}, "settled": {"status": "settled"},
        "archived_true": {"archived": "true"}, "archived_false": {"archived": "false"},
        "in_range": {"since_ms": archived_ms - 1, "until_ms": archived_ms + 1},
        "before_range": {"until_ms": archived_ms - 1, "archived": "true"},
        "after_range": {"since_ms": archived_ms + 1},
        "blocked": {"blocked": "true"},
    }
    out = {}
    for name, query in queries.items():
        r = await http.get("/v1/sessions", params=query, headers=READ)
        assert r.status_code == 200, (name, r.text)
        out[name] = [row["session_id"] for row in r.json()["sessions"]]
        out[f"{name}:rows"] = r.json()["sessions"]
    return out


@pytest.fixture(scope="module")
async def archived(redis_server: RedisServer, nats_server: NatsServer,
                   tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Archived]:
    home = tmp_path_factory.mktemp("archived-reads")
    settings = Settings(redis_url=redis_server.url, nats_url=nats_server.url,
                        namespace="t" + uuid4().hex[:10], session_retention_s=3600.0,
                        archive_url=str(home / "archive"))
    env = {**settings.to_env(), "BATON_HOME": str(home / "baton")}
    async with MailboxServer() as mailbox:
        settings = settings.model_copy(update={"mail_url": mailbox.url})
        async with running(*trio(settings, app)), Client.connect(settings) as client:
            sid, task_id, _ = await client.start_task(
                None, "notice-batch", {"recipients": RECIPIENTS, "subject": "Notice",
                                       "body": "Approved."}, agent="notice-batch")
            await client.wait_task(sid, task_id, timeout=30)
            sub, _ = await client.submit("Summarise what was sent.", agent="notice-batch",
                                         session_id=sid)
            assert (await client.wait(sub, timeout=30)).status == "completed"
    # The services are gone: nothing but this test touches the session from here on.
    store = await Store.connect(settings)
    archive = Archive.from_url(settings.archive_location())
    try:
        await store.redis.hset(store.keys.session(sid).meta, "retain_at", 1)  # it is due
        lease = await store.acquire(sid, ME, 120_000)
        async with serving_api(settings, _tokens()) as url, httpx.AsyncClient(
                base_url=url, timeout=60) as http:
            before = await _read_everything(settings, env, http, sid, task_id, sub)
            before_list = await _listings(http, now_ms())
            watched: list[dict[str, Any]] = []
            watching = asyncio.create_task(Watch(settings, sid, watched.append,
                                                 block_ms=100).run())
            streamed: list[tuple[str, dict[str, Any]]] = []
            async with http.stream("GET", f"/v1/sessions/{sid}/events",
                                   headers=READ) as stream:
                sse = SseReader(stream)
                streamed.append((await sse.next())[:2])  # the live snapshot
                await eventually(lambda: watched, timeout=30, message="the watch's snapshot")

                assert await retention.archive_if_due(store, archive, sid, lease.fence, ME)

                # Both followers notice the archival when idle and end.
                await asyncio.wait_for(watching, 60)
                while True:
                    try:
                        streamed.append((await sse.next())[:2])
                    except EOFError:
                        break
            tomb = await retention.tombstone(store, sid)
            archived_ms = int(tomb["at"])
            after = await _read_everything(settings, env, http, sid, task_id, sub)
            after_list = await _listings(http, archived_ms)
            resumed = await http.get(f"/v1/sessions/{sid}/events", headers={
                **READ, "Last-Event-ID": after.api["events"][0][1]["last_id"]})
            missing = await _missing(settings, env, http)
            # The tombstone expires (here: goes at once); the archive is asked by the id.
            sk = store.keys.session(sid)
            await store.redis.delete(sk.archived)
            await store.redis.zrem(store.keys.archived(sk.shard), sid)
            expired = Reading()
            async with Client.connect(settings) as client:
                expired.client = {"wait": await client.wait(sub, timeout=30),
                                  "archival": await client.archival(sid)}
            r = await http.get(f"/v1/sessions/{sid}", headers=READ)
            assert r.status_code == 200, r.text
            expired.api["detail"] = r.json()
            expired.api["list"] = (await http.get("/v1/sessions", headers=READ)).json()
            expired.cli["trace"] = (await _cli_json(env, "trace", sid))[0]
        # An API whose tombstone window has passed lists it from the archive's index.
        passed = settings.model_copy(update={"tombstone_ttl_s": 0.001})
        async with serving_api(passed, _tokens()) as url, httpx.AsyncClient(
                base_url=url, timeout=60) as http:
            for name, query in (("index", {"archived": "true"}),
                                ("index_completed", {"status": "completed"}),
                                ("index_failed", {"status": "failed", "archived": "true"}),
                                ("index_other_agent", {"archived": "true", "agent": "notices"}),
                                ("index_range", {"archived": "true",
                                                 "since_ms": archived_ms + 1})):
                r = await http.get("/v1/sessions", params=query, headers=READ)
                assert r.status_code == 200, r.text
                expired.api[name] = r.json()
        missing["resumed_status"] = resumed.status_code
        yield Archived(settings, home, sid, task_id, sub, archived_ms, before, after,
                       watched, streamed, expired,
                       {**missing, "before_list": before_list, "after_list": after_list})
    finally:
        await archive.close()
        await store.close()


async def _missing(settings: Settings, env: dict[str, str],
                   http: httpx.AsyncClient) -> dict[str, Any]:
    """How each reader answers for a session that never existed."""
    sid = "s-never-" + uuid4().hex[:8]
    out: dict[str, Any] = {"sid": sid}
    async with Client.connect(settings) as client:
        for name, read in (("task", client.task(sid, "t-1")),
                           ("document", client.document(sid, PLAN)),
                           ("archival", client.archival(sid)),
                           ("cancelled", client.wait_cancelled(sid, timeout=5))):
            with pytest.raises(NotFoundError) as caught:
                await read
            out[f"client_{name}"] = str(caught.value)
    for name in ("trace", "inspect"):
        done = await asyncio.to_thread(_cli, env, name, sid)
        out[f"cli_{name}"] = (done.returncode, done.stderr)
    for path in ("", "/trace", "/entries", "/events", f"/documents/{PLAN}", "/tasks/t-1"):
        r = await http.get(f"/v1/sessions/{sid}{path}", headers=READ)
        out[f"api{path or '/'}"] = r.status_code
    return out


def _without(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    """``d`` without ``keys``, its task and submission lists in id order: they come in the
    order of a hash's fields, which Redis may change between two reads of the same hash (its
    incremental rehashing), so two reads of a live session may list them differently too."""
    out = {k: v for k, v in d.items() if k not in keys}
    for name, key in (("tasks", "task_id"), ("submissions", "submission_id")):
        if isinstance(out.get(name), list):
            out[name] = sorted(out[name], key=lambda x: str(x[key]))
    return out


MARKER = ("archived", "archived_ms")


# ---------------------------------------------------------------------- the client


def test_the_client_reads_an_archived_session_as_it_read_it_live(archived: Archived) -> None:
    before, after = archived.before.client, archived.after.client
    assert _without(before, "archival") == _without(after, "archival")
    assert before["wait"].status == "completed" and before["wait"].answer
    assert before["task"].state.name == "terminal" and before["document"].value["recipients"]
    assert before["archival"] is None
    mark = after["archival"]
    assert mark is not None and mark.archived_ms == archived.archived_ms and mark.tombstone
    assert mark.object.endswith(f"/sessions/{archived.sid}.json.zst")


def test_once_the_tombstone_is_gone_the_archive_is_asked_by_id(archived: Archived) -> None:
    expired = archived.expired
    assert expired.client["wait"] == archived.before.client["wait"]
    mark = expired.client["archival"]
    assert mark is not None and not mark.tombstone
    detail = expired.api["detail"]
    assert detail["archived"] is True and detail["archived_ms"] >= archived.archived_ms - 5_000
    assert _without(detail, *MARKER) == _without(archived.after.api["detail"], *MARKER)
    assert _without(expired.cli["trace"], *MARKER) == _without(
        archived.after.cli["trace"], *MARKER)
    # Without its tombstone it is no longer in Redis' listing ...
    assert archived.sid not in [r["session_id"] for r in expired.api["list"]["sessions"]]


def test_a_session_that_never_existed_is_still_not_found(archived: Archived) -> None:
    missing = archived.missing
    sid = missing["sid"]
    for name in ("task", "document", "archival", "cancelled"):
        assert f"session {sid}" in missing[f"client_{name}"], missing
    for name in ("trace", "inspect"):
        code, stderr = missing[f"cli_{name}"]
        assert code != 0 and f"no session {sid}" in stderr, stderr
    assert {k: v for k, v in missing.items() if k.startswith("api/")} == {
        "api/": 404, "api/trace": 404, "api/entries": 404, "api/events": 404,
        f"api/documents/{PLAN}": 404, "api/tasks/t-1": 404}


# ---------------------------------------------------------------------- the command line


def test_trace_is_the_same_timeline_marked_archived(archived: Archived) -> None:
    before, after = archived.before.cli["trace"], archived.after.cli["trace"]
    assert (before["archived"], before["archived_ms"]) == (False, None)
    assert (after["archived"], after["archived_ms"]) == (True, archived.archived_ms)
    assert _without(before, *MARKER) == _without(after, *MARKER)
    assert len(after["events"]) > 10
    assert "ARCHIVED at" not in archived.before.cli["trace_text"]
    text = archived.after.cli["trace_text"].splitlines()
    assert text[1].startswith("ARCHIVED at ") and "read from the archive" in text[1]
    assert [line for i, line in enumerate(text) if i != 1] == \
        archived.before.cli["trace_text"].splitlines()


def test_inspect_shows_the_session_as_it_was_its_lease_ended_by_the_archival(
        archived: Archived) -> None:
    before, after = archived.before.cli["inspect"], archived.after.cli["inspect"]
    assert (after["archived"], after["archived_ms"]) == (True, archived.archived_ms)
    assert before["archived"] is False
    # What the archival itself changed: the lease it was archived under ended, and the
    # retention timer went with the session.
    assert before["lease"]["live"] and not after["lease"]["live"]
    assert {k: after["lease"][k] for k in ("holder", "fence", "dirty")} == {
        k: before["lease"][k] for k in ("holder", "fence", "dirty")}
    assert [t["timer"] for t in before["timers"]] == ["retain"] and after["timers"] == []
    assert _without(before, *MARKER, "lease", "timers") == _without(
        after, *MARKER, "lease", "timers")
    # the batch, a child per recipient, the generation; a send per recipient
    assert len(after["tasks"]) == 2 + len(RECIPIENTS) and len(after["runs"]) == len(RECIPIENTS)
    text = archived.after.cli["inspect_text"]
    assert "ARCHIVED at" in text and "ended by the archival" in text
    assert "ARCHIVED" not in archived.before.cli["inspect_text"]


def test_watch_shows_the_snapshot_and_ends(archived: Archived) -> None:
    (before,) = archived.before.cli["watch"]
    snapshot, end = archived.after.cli["watch"]
    assert before["type"] == snapshot["type"] == "snapshot"
    assert before["lease"]["live"] and not snapshot["lease"]["live"]
    assert _without(before, *MARKER, "lease") == _without(snapshot, *MARKER, "lease")
    assert snapshot["archived"] is True and snapshot["archived_ms"] == archived.archived_ms
    assert end == {"type": "archived", "session_id": archived.sid,
                   "last_id": snapshot["last_id"], "archived": True,
                   "archived_ms": archived.archived_ms}


def test_watch_resumed_from_an_id_shows_the_same_changes_then_ends(
        archived: Archived) -> None:
    before, after = archived.before.cli["watch_from"], archived.after.cli["watch_from"]
    assert before[0]["type"] == "resume" and len(before) > 10
    assert after[:-1] == before
    assert after[-1]["type"] == "archived" and after[-1]["last_id"] == before[-1]["id"]


def test_a_watch_following_the_session_ends_when_it_is_archived(archived: Archived) -> None:
    items = archived.watched
    assert items[0]["type"] == "snapshot" and items[0]["archived"] is False
    assert items[-1]["type"] == "archived"
    assert items[-1]["archived_ms"] == archived.archived_ms
    assert items[-1]["last_id"] == items[0]["last_id"]  # no change came in between


# ---------------------------------------------------------------------- the API


def test_the_api_views_are_the_same_marked_archived(archived: Archived) -> None:
    before, after = archived.before.api, archived.after.api
    for name in ("detail", "entries", "trace", "plan"):
        assert (before[name]["archived"], before[name]["archived_ms"]) == (False, None), name
        assert (after[name]["archived"], after[name]["archived_ms"]) == (
            True, archived.archived_ms), name
    for name in ("entries", "trace", "plan"):
        assert _without(before[name], *MARKER) == _without(after[name], *MARKER), name
    b, a = before["detail"], after["detail"]
    assert b["lease"]["live"] and not a["lease"]["live"]
    assert _without(b, *MARKER, "lease", "timers") == _without(a, *MARKER, "lease", "timers")
    assert [d["name"] for d in a["documents"]] == sorted([PLAN, SUMMARY])
    assert a["entries"] == len(after["entries"]["entries"]) > 0


def test_submissions_and_tasks_are_the_same_bodies_with_an_archived_header(
        archived: Archived) -> None:
    before, after = archived.before, archived.after
    for name in ("submission", "task"):
        assert before.api[name] == after.api[name], name
        assert "baton-archived" not in before.headers[name]
        assert after.headers[name]["baton-archived"] == str(archived.archived_ms)
    assert after.api["submission"]["status"] == "completed"


def test_the_event_stream_sends_the_snapshot_then_archived_and_ends(archived: Archived) -> None:
    ((kind, live),) = archived.before.api["events"]
    events = archived.after.api["events"]
    assert [e for e, _ in events] == ["snapshot", "archived"]
    snapshot = events[0][1]
    assert kind == "snapshot" and live["archived"] is False and snapshot["archived"] is True
    assert _without(live, *MARKER, "lease") == _without(snapshot, *MARKER, "lease")
    assert events[1][1]["archived_ms"] == archived.archived_ms
    # A reconnect after everything it holds: 204, which ends an EventSource for good.
    assert archived.missing["resumed_status"] == 204


def test_a_stream_open_while_the_session_is_archived_ends_with_archived(
        archived: Archived) -> None:
    kinds = [e for e, _ in archived.streamed]
    assert kinds[0] == "snapshot" and kinds[-1] == "archived", kinds
    assert archived.streamed[-1][1]["archived_ms"] == archived.archived_ms


def test_the_session_list_has_it_as_archived_with_every_filter(archived: Archived) -> None:
    before, after = archived.missing["before_list"], archived.missing["after_list"]
    sid = archived.sid
    (live,) = [r for r in before["all:rows"] if r["session_id"] == sid]
    assert live["state"] == "leased" and live["archived"] is False
    (row,) = [r for r in after["all:rows"] if r["session_id"] == sid]
    assert row == {
        "session_id": sid, "state": "archived", "fence": live["fence"], "holder": None,
        "seq": live["seq"], "agent": "notice-batch", "compat": 1, "blocked": None,
        "submissions": {}, "quarantined": False, "quarantine": None, "archived": True,
        "archived_ms": archived.archived_ms, "status": "completed", "submission_count": 1,
        "created_ms": row["created_ms"]}
    assert row["created_ms"] and row["created_ms"] < archived.archived_ms
    for name in ("all", "agent", "status_archived", "completed", "archived_true", "in_range"):
        assert sid in after[name], name
    for name in ("other_agent", "failed", "settled", "archived_false", "before_range",
                 "after_range", "blocked"):
        assert sid not in after[name], name
    for name in ("all", "agent", "archived_false"):  # live (leased) while read
        assert sid in before[name], name
    for name in ("status_archived", "archived_true", "settled"):
        assert sid not in before[name], name


def test_older_archived_sessions_are_listed_from_the_archive_index(archived: Archived) -> None:
    expired = archived.expired.api
    rows = [r for r in expired["index"]["sessions"] if r["session_id"] == archived.sid]
    assert len(rows) == 1
    row = rows[0]
    assert row["state"] == "archived" and row["status"] == "completed"
    assert row["agent"] == "notice-batch" and row["archived"] is True
    assert row["fence"] is None and row["submission_count"] is None  # the index knows less
    since, until = expired["index"]["index_range"]
    assert since <= row["archived_ms"] < until
    assert archived.sid in [r["session_id"] for r in expired["index_completed"]["sessions"]]
    for name in ("index_failed", "index_other_agent", "index_range"):
        assert archived.sid not in [r["session_id"] for r in expired[name]["sessions"]], name


async def test_a_restored_session_is_read_from_redis_not_from_its_old_object(
        archived: Archived) -> None:
    """The index is a hint and the archive keeps a restored session's object: a session in
    Redis is read from Redis."""
    passed = archived.settings.model_copy(update={"tombstone_ttl_s": 0.001})
    async with Client.connect(archived.settings) as client:
        # Its tombstone's window has passed for this store: listed from the index.
        store = Store(client.store.redis, passed)
        reads = ArchivedReads(store, lambda: client.archived.archive)
        source = await reads.locate(archived.sid)
        assert source.archived  # its tombstone is gone, its object is there: archived
        listing = await reads.listing(from_archive=True, limit=10)
        assert archived.sid in [r.session_id for r in listing.rows]
        sk = store.keys.session(archived.sid)
        await store.redis.hset(sk.meta, mapping={"agent": "notice-batch", "seq": "1"})
        try:
            again = await reads.locate(archived.sid)
            assert again.found and not again.archived and again.store is store
            listing = await reads.listing(from_archive=True, limit=10)
            assert archived.sid not in [r.session_id for r in listing.rows]
        finally:
            await store.redis.delete(sk.meta)


# ---------------------------------------------------------------------- the console


async def test_the_console_marks_an_archived_session(archived: Archived, browser: Any) -> None:
    """In a real browser: the list's ``archived`` filter (read from the archive's index, the
    tombstone's window having passed for this API) shows the session with its badge, and its
    page shows it archived, from the API's ``archived`` field, with no stream to follow."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from tests.browser import count, in_thread, wait

    passed = archived.settings.model_copy(update={"tombstone_ttl_s": 0.001})
    sid = archived.sid
    row = f'#sessions tr[data-session="{sid}"][data-archived="true"] .st-archived'
    async with serving_api(passed, Tokens({}, anonymous="read")) as url:
        await in_thread(lambda: browser.get(f"{url}/console/#/sessions"))
        await in_thread(lambda: wait(browser, lambda d: "read" in d.find_element(
            By.ID, "role").text, 15, "the read role of the open API"))
        await in_thread(lambda: Select(browser.find_element(
            By.CSS_SELECTOR, 'select[aria-label="status"]')).select_by_value("archived"))
        await in_thread(lambda: wait(browser, lambda d: count(d, row) == 1, 15,
                                     "the archived session with its badge"))
        await in_thread(lambda: browser.find_element(
            By.CSS_SELECTOR, f'#sessions tr[data-session="{sid}"]').click())
        await in_thread(lambda: wait(browser, lambda d: count(d, "#archived .st-archived") == 1
                                     and d.find_element(By.ID, "live").text == "archived", 15,
                                     "the session's page marked archived"))
        assert await in_thread(lambda: count(browser, "[data-submission] .st-completed")) == 1
        assert await in_thread(lambda: not browser.find_element(
            By.ID, "cancel-session").is_enabled())
        logs = await in_thread(lambda: browser.get_log("browser"))
    assert not [e for e in logs if e.get("level") == "SEVERE"], logs


# ---------------------------------------------------------------------- on a Redis Cluster


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_reads_fall_through_on_one_server_and_on_a_cluster(
        topology: str, topo_settings: Settings, tmp_path: Path) -> None:
    """A session settled by hand (as a Brain would) and archived: the client's wait, the
    located source and the listing, on either topology (the listing reads every shard)."""
    settings = topo_settings.model_copy(update={"archive_url": str(tmp_path / "archive")})
    sid = "s-topo-" + uuid4().hex[:8]
    async with Client.connect(settings) as client:
        store = client.store
        sub, _ = await client.submit("hello", agent="notices", session_id=sid,
                                     request_id="r-1")
        await take_up(store, sid, ME)
        lease, state = await store.acquire_and_load(sid, ME, 30_000)
        (task,) = state.tasks.values()
        settled = state.submissions[sub.id].model_copy(update={
            "status": "completed", "answer": "hi", "settled_ms": 1})
        await store.commit(sid, lease.fence, Writes(
            kind="final", tasks=[task.model_copy(update={"state": Terminal(outcome="completed")})],
            deadline_ms=-1, retain_ms=1, submissions=[settled]), ME)
        live = await client.wait(sub, timeout=10)
        assert await client.archival(sid) is None
        assert (await client.archived.listing()).rows == []
        with pytest.raises(NotFoundError):
            await client.archival(sid + "-never")
        await eventually(lambda: retention.archive_if_due(
            store, client.archived.archive, sid, lease.fence, ME), message="archived")
        assert not await store.redis.exists(store.keys.session(sid).meta)
        assert await client.wait(sub, timeout=10) == live
        mark = await client.archival(sid)
        assert mark is not None and mark.fence == lease.fence
        listing = await client.archived.listing(agent="notices", status="completed")
        assert [(r.session_id, r.status, r.archived_ms) for r in listing.rows] == [
            (sid, "completed", mark.archived_ms)]
        assert listing.in_redis == 1
