"""The HTTP API against real Redis and NATS, with Brain, Hands and Relay in this event loop.

One approval-gated session is driven only through the API: submitted once per
Idempotency-Key, followed as Server-Sent Events (a snapshot, then every change, resumable
after any change with Last-Event-ID), approved and rejected, listed with filters. Tokens
separate reading from operating, and every error is RFC 9457 problem details.
"""

from __future__ import annotations

from typing import Any

import httpx

from baton.api.auth import Tokens
from baton.brain.worker import BrainWorker
from baton.devkit.mailbox import MailboxServer
from baton.hands.worker import HandsWorker
from baton.relay.worker import Relay
from baton.settings import Settings
from tests.api_helpers import SseReader, auth, problem, serving_api
from tests.control_apps import approval_app
from tests.helpers import eventually, running

TWO = "Send the approved notice to ada@example.com and grace@example.com, then summarise."
READ_TOKEN = "read-token-0123456789"
OPERATE_TOKEN = "operate-token-0123456789"


def _tokens() -> Tokens:
    return Tokens(Tokens.parse(f"read:{READ_TOKEN},operate:{OPERATE_TOKEN}", "test"))




async def _changes_until_settled(reader: SseReader) -> list[tuple[str, dict[str, Any], str | None]]:
    seen = []
    while True:
        item = await reader.next()
        seen.append(item)
        event, data, _ = item
        if event == "submission" and data["status"] == "completed":
            # The rest of this change (the id comes on its last message).
            while seen[-1][2] is None:
                seen.append(await reader.next())
            return seen


async def _resumed(http: httpx.AsyncClient, sid: str, after: str, last: str,
                   read: dict[str, str]) -> list[str]:
    """The change ids a stream resumed after ``after`` sends, up to the change ``last``."""
    headers = {**read, "Last-Event-ID": after}
    ids: list[str] = []
    async with http.stream("GET", f"/v1/sessions/{sid}/events", headers=headers) as stream:
        reader = SseReader(stream)
        event, data, ident = await reader.next()
        assert event == "resume" and data["after"] == after and ident == after
        while not ids or ids[-1] != last:
            _, _, ident = await reader.next()
            if ident is not None:
                ids.append(ident)
    return ids


async def test_a_session_driven_through_the_api(settings: Settings,
                                                mailbox: MailboxServer) -> None:
    settings = settings.model_copy(update={"mail_url": mailbox.url})
    brain = BrainWorker(settings.model_copy(update={"worker_name": "brain-1"}), approval_app)
    hands = HandsWorker(settings.model_copy(update={"worker_name": "hands-1"}), approval_app)
    relay = Relay(settings.model_copy(update={"worker_name": "relay-1"}))
    async with running(relay, hands, brain), serving_api(settings, _tokens()) as url, \
            httpx.AsyncClient(base_url=url, timeout=20) as http:
        # Tokens: none is 401, a read token may not write (403).
        problem(await http.get("/v1/sessions"), 401, "unauthenticated")
        problem(await http.get("/v1/sessions", headers=auth("x" * 20)), 401,
                 "unauthenticated")
        body = {"text": TWO, "agent": "notices"}
        problem(await http.post("/v1/submissions", json=body, headers=auth(READ_TOKEN)),
                 403, "forbidden")
        operate = {**auth(OPERATE_TOKEN), "Idempotency-Key": "order-1"}
        first = await http.post("/v1/submissions", json=body, headers=operate)
        assert first.status_code == 201, first.text
        again = await http.post("/v1/submissions", json=body, headers=operate)
        assert again.status_code == 200 and again.json()["created"] is False
        sub = first.json()["submission"]
        assert again.json()["submission"]["id"] == sub["id"]
        sid = sub["session_id"]
        assert first.headers["location"] == f"/v1/sessions/{sid}/submissions/{sub['id']}"
        read = auth(READ_TOKEN)

        async with http.stream("GET", f"/v1/sessions/{sid}/events", headers=read) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            reader = SseReader(stream)
            event, snapshot, snap_id = await reader.next()
            assert event == "snapshot" and snapshot["session_id"] == sid
            assert snap_id == snapshot["last_id"]

            async def awaiting() -> list[dict[str, Any]]:
                view = (await http.get(f"/v1/sessions/{sid}", headers=read)).json()
                return view["awaiting_approval"] if len(view["awaiting_approval"]) == 2 else []

            ada, grace = sorted(await eventually(awaiting, timeout=15),
                                key=lambda a: a["arguments"]["to"])
            base = f"/v1/sessions/{sid}/runs"
            wrong = await http.post(f"{base}/{ada['run_id']}/approve",
                                    json={"digest": grace["digest"]}, headers=operate)
            problem(wrong, 409, "conflict")
            ok = await http.post(f"{base}/{ada['run_id']}/approve",
                                 json={"digest": ada["digest"]}, headers=operate)
            assert ok.status_code == 200 and ok.json()["seq"] > 0, ok.text
            no = await http.post(f"{base}/{grace['run_id']}/reject",
                                 json={"reason": "not this one"}, headers=operate)
            assert no.status_code == 200, no.text
            live = await _changes_until_settled(reader)

            # Everything after the snapshot, one change per receipt id, the id on its last
            # message.
            receipts = [d["id"] for e, d, _ in live if e == "receipt"]
            ids = [i for _, _, i in live if i is not None]
            assert ids == receipts and len(set(ids)) == len(ids)
            kinds = [d["kind"] for e, d, _ in live if e == "receipt"]
            assert "approve" in kinds and "reject" in kinds
            assert any(e == "mark" and d["mark"] == "applied" for e, d, _ in live)

            # Resuming after a change mid-way replays exactly the changes after it: from the
            # session's feed while another stream follows it ...
            middle = ids[len(ids) // 2]
            after = ids[ids.index(middle) + 1:]
            assert await _resumed(http, sid, middle, ids[-1], read) == after
            # ... from a watch of its own when the feed started after the id ...
            assert (await _resumed(http, sid, "0-0", ids[-1], read))[-len(ids):] == ids
        # ... and with no stream left, from a watch that starts at the id.
        assert await _resumed(http, sid, middle, ids[-1], read) == after

        final = (await http.get(f"/v1/sessions/{sid}/submissions/{sub['id']}?wait=10",
                                headers=read)).json()
        assert final["status"] == "completed"
        assert "grace@example.com: failed (rejected)" in final["answer"]
        task = (await http.get(f"/v1/sessions/{sid}/tasks/{sub['task_id']}", headers=read)).json()
        assert task["id"] == sub["task_id"] and task["state"]["name"] == "terminal"

        # Lists with filters, workers with the levels they serve, dead letters, the trace.
        listed = (await http.get("/v1/sessions", params={"status": "settled"},
                                 headers=read)).json()
        assert sid in [s["session_id"] for s in listed["sessions"]]
        other = (await http.get("/v1/sessions", params={"agent": "nobody"}, headers=read)).json()
        assert other["sessions"] == []
        q = (await http.get("/v1/sessions", params={"quarantined": "true"}, headers=read)).json()
        assert sid not in [s["session_id"] for s in q["sessions"]]
        future = (await http.get("/v1/sessions", params={"since_ms": 2**42},
                                 headers=read)).json()
        assert future["sessions"] == [] and future["total"] == 0
        workers = (await http.get("/v1/workers", headers=read)).json()
        assert {"agent": "notices", "compat": 1, "brains": ["brain-1"]} in workers["levels"]
        dead = (await http.get("/v1/dead-letters", headers=read)).json()
        assert dead["count"] == len(dead["items"])
        trace = (await http.get(f"/v1/sessions/{sid}/trace", headers=read)).json()
        # The receipts the stream showed, in its order (a late wake's lease may follow them).
        traced = [e["stream_id"] for e in trace["events"]]
        start = traced.index(receipts[0])
        assert traced[start:start + len(receipts)] == receipts
        entries = (await http.get(f"/v1/sessions/{sid}/entries?start=-2", headers=read)).json()
        assert [e["index"] for e in entries["entries"]] == [entries["total"] - 2,
                                                           entries["total"] - 1]

        # Problems: unknown ids, bad input, unknown paths; the OpenAPI document.
        problem(await http.get("/v1/sessions/s-nope", headers=read), 404, "not_found")
        problem(await http.get("/v1/sessions/s-nope/events", headers=read), 404, "not_found")
        problem(await http.get(f"/v1/sessions/{sid}/tasks/t-nope", headers=read), 404,
                 "not_found")
        bad = problem(await http.post("/v1/submissions", json={"agent": "notices"},
                                       headers=operate), 422, "invalid_request")
        assert bad["errors"][0]["loc"] == ["body", "text"]
        problem(await http.get("/v1/sessions", params={"limit": 0}, headers=read), 422,
                 "invalid_request")
        problem(await http.get("/v1/nowhere", headers=read), 404, "not_found")
        problem(await http.post(f"{base}/r-nope/approve", json={"digest": "d"},
                                 headers=operate), 404, "not_found")
        spec = (await http.get("/openapi.json")).json()
        assert {"/v1/submissions", "/v1/tasks", "/v1/sessions/{session_id}/events",
                "/v1/sessions/{session_id}/cancel", "/v1/dead-letters",
                "/v1/workers"} <= set(spec["paths"])
        assert "Problem" in spec["components"]["schemas"]
        console = await http.get("/console/")
        assert console.status_code == 200 and "app.js" in console.text

    stats = dict((await httpx.AsyncClient().get(f"{mailbox.url}/stats")).json())
    assert stats["deliveries"] == {"ada@example.com": 1} and stats["raw_requests"] == 1


async def test_an_open_api_serves_loopback_in_dev_only(settings: Settings) -> None:
    """Without tokens: dev mode on loopback answers anonymous requests as an operator."""
    tokens = Tokens.load(host="127.0.0.1", dev=True, env={})
    async with serving_api(settings, tokens) as url, httpx.AsyncClient(base_url=url) as http:
        me = (await http.get("/v1/whoami")).json()
        assert me == {"role": "operate", "may_operate": True, "namespace": settings.namespace}
        started = await http.post("/v1/tasks", json={"kind": "nothing", "agent": "a"},
                                  headers={"Idempotency-Key": "k-1"})
        assert started.status_code == 201, started.text
        twice = await http.post("/v1/tasks", json={"kind": "nothing", "agent": "a"},
                                headers={"Idempotency-Key": "k-1"})
        assert twice.status_code == 200 and twice.json() == {**started.json(), "created": False}
        cancel = await http.post(f"/v1/sessions/{started.json()['session_id']}/cancel", json={})
        assert cancel.status_code == 200 and cancel.json()["status"] in ("requested", "pending")
        # Bodies with nothing to say may be left out; a task's agent is its kind by default.
        alone = await http.post("/v1/tasks", json={"kind": "nothing"})
        assert alone.status_code == 201, alone.text
        sid = alone.json()["session_id"]
        assert (await http.get(f"/v1/sessions/{sid}")).json()["agent"] == "nothing"
        upper = await http.post("/v1/tasks", json={"kind": "Nothing"})  # not an agent name
        assert upper.status_code in (400, 422) and "name the agent" in upper.text, upper.text
        # ... but a change is sent as JSON all the same (a form from a page elsewhere is not)
        json_only = {"Content-Type": "application/json"}
        problem(await http.post(f"/v1/sessions/{sid}/cancel"), 415, "json_required")
        bare = await http.post(f"/v1/sessions/{sid}/cancel", headers=json_only)
        assert bare.status_code == 200 and bare.json()["status"] == "requested", bare.text
        unknown = await http.post(f"/v1/sessions/{sid}/runs/r-none/reject", headers=json_only)
        assert unknown.status_code == 404, unknown.text  # the body was not what failed


async def test_the_events_of_a_session_no_brain_opened_yet_keep_streaming(
    settings: Settings,
) -> None:
    """A stream opened right after a submission, before any Brain took its request up (no
    Brain runs here), follows the session instead of ending with "no session"."""
    tokens = Tokens.load(host="127.0.0.1", dev=True, env={})
    async with serving_api(settings, tokens) as url, \
            httpx.AsyncClient(base_url=url, timeout=20) as http:
        first = await http.post("/v1/submissions", json={"text": "one", "agent": "notices"},
                                headers={"Idempotency-Key": "early-1"})
        assert first.status_code == 201, first.text
        sid = first.json()["submission"]["session_id"]
        # as the CLI warns: nothing serves the agent, the input waits
        assert first.json()["warnings"] == [
            f"no live Brain serves agent notices at compat level 1 in namespace "
            f"{settings.namespace}: kept, it waits until one starts"]
        task = await http.post("/v1/tasks", json={"kind": "nope"})
        assert task.status_code == 201 and "agent nope at compat level 1" in \
            task.json()["warnings"][0], task.text
        # An id this stream never sent (later than the newest change): a snapshot, not a
        # resume that would wait after it for good.
        async with http.stream("GET", f"/v1/sessions/{sid}/events",
                               headers={"Last-Event-ID": "99999999999999-0"}) as stream:
            event, snapshot, _ = await SseReader(stream).next()
            assert event == "snapshot" and snapshot["session_id"] == sid
        async with http.stream("GET", f"/v1/sessions/{sid}/events") as stream:
            reader = SseReader(stream)
            event, snapshot, _ = await reader.next()
            assert event == "snapshot" and snapshot["session_id"] == sid
            again = await http.post("/v1/submissions",
                                    json={"text": "two", "agent": "notices", "session_id": sid},
                                    headers={"Idempotency-Key": "early-2"})
            assert again.status_code == 201, again.text
            event, data, _ = await reader.next()
            assert event == "receipt" and data["kind"] == "submit", (event, data)
