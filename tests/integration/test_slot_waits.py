"""A run waiting for a capped tool's slot is seen waiting, then granted, by every reader of a
session: ``baton watch``, the API's event feed (what the console follows), the console's
session view and timeline, and ``baton trace`` with the wait's length. Real Redis, NATS and
the mail service: its hold (``POST /hold``) keeps the cap's three sends in, so the session's
other two runs wait in line until ``POST /release``, whatever the machine's load.

And the note itself (slot_wait.lua): a confined Hands may write it, nothing is written for a
run that is no live one, and a hostile argument is refused with nothing written.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from typing import Any

import httpx
import pytest
from redis.exceptions import ResponseError

from baton.api.auth import Tokens
from baton.brain.worker import BrainWorker
from baton.cli.trace import build_trace
from baton.client import Client
from baton.devkit.mailbox import MailboxServer
from baton.errors import BatonError
from baton.hands.worker import HandsWorker
from baton.receipts import Receipt
from baton.relay.worker import Relay
from baton.settings import Settings
from baton.store.keys import Keys
from baton.store.limits import Limits
from baton.store.redis_client import connect_redis
from baton.store.scripts import declared
from baton.store.store import Store, worker_ref
from tests.api_helpers import SseReader, auth, serving_api
from tests.helpers import eventually, running
from tests.integration.capped_apps import CAP, app, capped_email
from tests.integration.confinement import OWN, Confined, sk

pytestmark = pytest.mark.slow

SENDS = 5  # one session's runs: CAP of them sent (and held), the others wait in line
WAITING = SENDS - CAP
READ = "read-token-0123456789"
WAITS = re.compile(r"(run \S+) waiting for a send_email slot \((\d+) in line\)")


def notice() -> str:
    to = ", ".join(f"w{i}@example.com" for i in range(SENDS))
    return f"Send the approved notice to {to}, then summarise."


def waiting(lines: list[str]) -> dict[str, int]:
    """Each run seen waiting in ``lines`` -> its place in line."""
    return {m.group(1): int(m.group(2)) for line in lines for m in [WAITS.search(line)] if m}


def causal(lines: list[str]) -> dict[str, int]:
    """Each run seen waiting in ``lines`` (texts in the order shown) -> its place in line;
    asserts that each one's grant follows its wait and precedes its claim, once each."""
    runs = waiting(lines)
    for run in runs:
        wait = [i for i, t in enumerate(lines) if f"{run} waiting for a send_email slot" in t]
        got = [i for i, t in enumerate(lines) if f"{run} got its send_email slot after" in t]
        claim = [i for i, t in enumerate(lines) if f"claimed {run} attempt" in t]
        assert len(wait) == len(got) == 1 and claim, (run, lines)
        assert wait[0] < got[0] < claim[0], (run, lines)
    return runs


async def _cli(settings: Settings, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "baton", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **settings.to_env(), "BATON_DEBUG": ""})


async def _lines_until(proc: asyncio.subprocess.Process, out: list[str], count: int) -> None:
    """Read ``proc``'s lines into ``out`` until ``count`` of them show a run waiting."""
    assert proc.stdout is not None
    while sum(bool(WAITS.search(line)) for line in out) < count:
        line = await proc.stdout.readline()
        assert line, f"watch ended early: {out}"
        out.append(line.decode())


async def _feed(reader: SseReader, receipts: list[dict[str, Any]], done: asyncio.Event) -> None:
    """The event feed's receipts, in order, until the session's submission completed."""
    while True:
        event, data, _ = await reader.next()
        if event == "receipt":
            receipts.append(data)
        if event == "submission" and data["status"] == "completed":
            done.set()
            return


async def test_a_run_waiting_for_a_slot_is_shown_waiting_then_granted_everywhere(
    settings: Settings,
) -> None:
    async with MailboxServer() as mailbox, httpx.AsyncClient(base_url=mailbox.url) as mail:
        s = settings.model_copy(update={"mail_url": mailbox.url, "hands_concurrency": 8})

        def named(name: str) -> Settings:
            return s.model_copy(update={"worker_name": name})

        services = [Relay(named("relay-1")), HandsWorker(named("hands-1"), app),
                    BrainWorker(named("brain-1"), app)]
        tokens = Tokens(Tokens.parse(f"read:{READ}", "test"))
        redis = connect_redis(s)
        limits = Limits(redis, Keys(s.namespace, s.shards), slot_ms=s.attempt_ttl_ms)
        async with running(*services), serving_api(s, tokens) as url, httpx.AsyncClient(
                base_url=url, timeout=30, headers=auth(READ)) as http:
            client = await Client.connect(s)
            watch: asyncio.subprocess.Process | None = None
            try:
                await mail.post("/hold")
                sub, _ = await client.submit(notice(), agent="notices")
                sid = sub.session_id

                async def queued() -> bool:
                    usage = await limits.look("send_email", capped_email.limit)
                    return mailbox.held == CAP and usage.waiting == WAITING
                await eventually(queued, timeout=60, message="the cap's sends held, 2 in line")

                # baton watch, from the session's first receipt (its changes, each receipt
                # a line), while the runs wait: they are seen waiting, none granted yet.
                watch = await _cli(s, "watch", sid, "--from", "0-0", "--until-settled")
                watched: list[str] = []
                await asyncio.wait_for(_lines_until(watch, watched, WAITING), 60)
                assert not any("got its send_email slot" in line for line in watched)
                waits = waiting(watched)
                assert sorted(waits.values()) == list(range(1, WAITING + 1)), watched
                assert all(" slot_wait: " in line for line in watched if WAITS.search(line))

                # The API's event feed, from the first receipt too (the console follows it).
                feed: list[dict[str, Any]] = []
                settled = asyncio.Event()
                async with http.stream("GET", f"/v1/sessions/{sid}/events",
                                       headers={"Last-Event-ID": "0-0"}) as stream:
                    reader = SseReader(stream)
                    event, _, _ = await reader.next()
                    assert event == "resume"
                    follow = asyncio.create_task(_feed(reader, feed, settled))
                    await eventually(lambda: sum(bool(WAITS.search(r["text"])) for r in feed)
                                     == WAITING, timeout=60, message="the feed's waits")
                    shown = [r for r in feed if r["kind"] == "slot_wait"]
                    assert {r["role"] for r in shown} == {"hands"}
                    assert all(r["worker"].startswith("hands-1") for r in shown)

                    # What the console draws: its runs table (the session's view says
                    # which runs wait, and where) and its timeline (the trace's events).
                    view = (await http.get(f"/v1/sessions/{sid}")).json()
                    rows = [r for r in view["runs"] if r.get("waiting_for")]
                    assert sorted(r["waiting_for"] for r in rows) == [
                        f"a send_email slot ({n} in line)" for n in range(1, WAITING + 1)]
                    trace = (await http.get(f"/v1/sessions/{sid}/trace")).json()
                    drawn = [e for e in trace["events"] if e["kind"] == "slot_wait"]
                    assert len(drawn) == WAITING and all("slot" in e["flags"] for e in drawn)
                    assert {m.group(1) for e in drawn for m in [WAITS.search(e["text"])] if m} \
                    == set(waits)

                    await mail.post("/release")
                    final = await client.wait(sub, timeout=120)
                    assert final.status == "completed"
                    await asyncio.wait_for(settled.wait(), 60)
                    await follow

                # Each waiting run, then its grant, then its claim: in the watch's lines ...
                rest, _ = await asyncio.wait_for(watch.communicate(), 60)
                watched += rest.decode().splitlines()
                assert watch.returncode == 0, watched
                assert causal(watched) == waits
                # ... in the feed's receipts (ids in order) ...
                assert causal([r["text"] for r in feed]) == waits
                ids = [tuple(map(int, r["id"].split("-"))) for r in feed]
                assert ids == sorted(ids) and len(set(ids)) == len(ids)
                # ... and in baton trace, with the wait's length.
                traced = await _cli(s, "trace", sid)
                text, err = await asyncio.wait_for(traced.communicate(), 60)
                assert traced.returncode == 0, err.decode()
                out = text.decode().splitlines()
                events = out[:out.index("tool runs (hops from commit timestamps):")]
                assert causal(events) == waits
                assert any(line.startswith(f"waits for a capped tool's slot: {WAITING}, "
                                           "longest ") for line in out), out
                assert sum("ms waiting for a slot)" in line for line in out) == WAITING
                as_json = await _cli(s, "trace", sid, "--json")
                text, err = await asyncio.wait_for(as_json.communicate(), 60)
                assert as_json.returncode == 0, err.decode()
                timeline = json.loads(text)
                granted = [e for e in timeline["events"] if "slot_wait" in e["hops"]]
                assert len(granted) == WAITING and all(e["hops"]["slot_wait"] >= 0
                                                       for e in granted)
                assert sum(r["slot_wait_ms"] is not None for r in timeline["runs"]) == WAITING
                # runs granted a slot at once wrote no note
                assert len([e for e in timeline["events"] if e["kind"] == "slot_wait"]) \
                    == 2 * WAITING
            finally:
                if watch is not None and watch.returncode is None:
                    watch.kill()
                    await watch.wait()
                await client.close()
        await redis.aclose()


async def test_a_hands_that_stops_while_runs_wait_says_they_left_the_line(
    settings: Settings,
) -> None:
    """Stopping, a Hands hands a waiting run's message back (another Hands takes it): the
    trace shows that run's wait ended there, not granted."""
    async with MailboxServer() as mailbox, httpx.AsyncClient(base_url=mailbox.url) as mail:
        s = settings.model_copy(update={"mail_url": mailbox.url, "hands_concurrency": 8})

        def named(name: str) -> Settings:
            return s.model_copy(update={"worker_name": name})

        hands = HandsWorker(named("hands-1"), app)
        redis = connect_redis(s)
        limits = Limits(redis, Keys(s.namespace, s.shards), slot_ms=s.attempt_ttl_ms)
        async with running(Relay(named("relay-1")), BrainWorker(named("brain-1"), app)):
            serving = asyncio.create_task(hands.serve())
            client = await Client.connect(s)
            try:
                await asyncio.wait_for(hands.ready.wait(), 60)
                await mail.post("/hold")
                sub, _ = await client.submit(notice(), agent="notices")

                async def queued() -> bool:
                    usage = await limits.look("send_email", capped_email.limit)
                    return mailbox.held == CAP and usage.waiting == WAITING
                await eventually(queued, timeout=60, message="the cap's sends held, 2 in line")

                async def left() -> list[str]:
                    receipts = await client.store.receipts(sub.session_id)
                    texts = [e.text for e in build_trace(sub.session_id, receipts).events]
                    ended = [t for t in texts if "stopped waiting for a send_email slot" in t]
                    return texts if len(ended) == WAITING else []
                hands.shutdown()
                texts = await eventually(left, timeout=60, message="the waits ended")
                await mail.post("/release")  # the held sends end, and the drain with them
                await asyncio.wait_for(serving, 60)
                assert waiting(texts).keys() == {
                    m.group(1) for t in texts
                    for m in [re.search(r"(run \S+) stopped waiting for a send_email slot "
                                        r"after \d+ ms: its Hands stopped", t)] if m}
                assert not any("got its send_email slot" in t for t in texts)
                usage = await limits.look("send_email", capped_email.limit)
                assert usage.waiting == 0  # their places given up with them
            finally:
                hands.shutdown()
                await asyncio.gather(serving, return_exceptions=True)
                await client.close()
        await redis.aclose()


async def test_a_confined_hands_notes_a_wait_of_a_live_run_only(confined: Confined) -> None:
    """The Hands' ACL user runs the note as its other scripts (its own receipts stream, no
    other write); a run that awaits an approval, is gone, or was applied gets none."""
    store = await Store.connect(confined.settings("hands"))
    admin = confined.connect("admin")  # reads what the Hands wrote (it may not XRANGE)
    hands = worker_ref("hands", "hands-1")
    key = sk(confined).receipts_hands
    try:
        before = await admin.xlen(key)
        assert await store.runs.slot_wait(OWN, "r1", "echo", hands, "waiting", position=4)
        assert await store.runs.slot_wait(OWN, "r1", "echo", hands, "granted", waited_ms=12)
        for rid in ("r2", "r-unknown", "r0"):  # awaiting approval, gone, applied
            assert not await store.runs.slot_wait(OWN, rid, "echo", hands, "waiting",
                                                  position=1)
        notes = [(i, f) for i, f in (await admin.xrange(key))[before:]]
        assert [json.loads(f["data"]) for _, f in notes] == [
            {"run_id": "r1", "tool": "echo", "state": "waiting", "position": 4,
             "waited_ms": 0},
            {"run_id": "r1", "tool": "echo", "state": "granted", "position": 0,
             "waited_ms": 12}]
        receipts = [Receipt.from_stream(i, f, "hands") for i, f in notes]
        assert [(r.kind, r.role, r.foreign, r.detail.state)  # type: ignore[union-attr]
                for r in receipts] == [("slot_wait", "hands", False, "waiting"),
                                       ("slot_wait", "hands", False, "granted")]
    finally:
        await admin.aclose()
        await store.close()


@pytest.mark.parametrize("pos, value", [
    (4, "asleep"), (4, ""), (1, ""), (1, "r" * 257), (2, ""), (3, "{" * 3000)])
async def test_a_hostile_text_argument_is_refused_with_nothing_written(
    store: Store, pos: int, value: str,
) -> None:
    """Beside the numbers (test_script_arguments.py): a state it does not know, an empty or
    oversized run id or tool, an oversized worker: refused with INVALID, nothing written."""
    from tests.integration.test_script_atomicity import Session

    sess = await Session.start(store)
    keys = declared("slot_wait", store.keys.session(sess.sid))
    args = ["", sess.intent.run_id, "send_email", worker_ref("hands", "h").model_dump_json(),
            "waiting", "1", "0"]
    args[pos] = value
    before = await store.redis.xlen(store.keys.session(sess.sid).receipts_hands)
    with pytest.raises(ResponseError, match=r"^INVALID"):
        await store.scripts.registered.slot_wait(keys=keys, args=args)
    assert await store.redis.xlen(store.keys.session(sess.sid).receipts_hands) == before
    with pytest.raises(BatonError):  # and through the store, as the Hands call it
        await store.runs.slot_wait(sess.sid, sess.intent.run_id, "send_email",
                                   worker_ref("hands", "h"), "asleep")
