"""What a hostile web page, a rebinding name or one greedy reader can do to the HTTP API:
against the real API server over real Redis and NATS (no Brain needed).

* Host must name the API (DNS rebinding), Origin must be its own, a change must be JSON
  (a cross-site form needs no preflight): each refused before any route, the session
  untouched. The browser's own view of these attacks is tests/integration/test_api_browser.py.
* Every answer carries a Content-Security-Policy with ``frame-ancestors 'none'``; /docs
  loads a pinned Swagger UI with Subresource Integrity; /healthz says only "ok" without a
  token, /readyz only "ready" (or 503) to anyone.
* An Idempotency-Key sent again with another request is refused (409), not answered with
  what the first one made.
* Event streams are capped per token and in all (429 with Retry-After); a Last-Event-ID
  older than the session's shared feed is caught up over the API's pooled connections, not
  with a Redis connection of its own (counted with CLIENT LIST).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from baton.api.auth import Tokens
from baton.api.guard import SWAGGER_UI
from baton.settings import Settings
from tests.api_helpers import SseReader, auth, problem, serving_api
from tests.helpers import eventually

READ = "read-token-0123456789"
OTHER_READ = "read-token-other-0123456789"
OPERATE = "operate-token-0123456789"


def _tokens() -> Tokens:
    return Tokens(Tokens.parse(f"read:{READ},read:{OTHER_READ},operate:{OPERATE}", "test"))




async def _task(http: httpx.AsyncClient, key: str) -> tuple[str, str]:
    """A root task nobody runs (no Brain here): its session and task ids."""
    r = await http.post("/v1/tasks", json={"kind": "nothing"},
                        headers={**auth(OPERATE), "Idempotency-Key": key})
    assert r.status_code == 201, r.text
    return r.json()["session_id"], r.json()["task_id"]


async def _cancels(http: httpx.AsyncClient, sid: str) -> list[str]:
    """The cancel intents committed in the session (``*``: all of it)."""
    view = (await http.get(f"/v1/sessions/{sid}")).json()  # the open dev API
    return list(view["cancel_intents"])


async def test_a_page_elsewhere_and_a_rebinding_name_are_refused(settings: Settings) -> None:
    # The open dev API (every loopback caller an operator): the worst case for a browser.
    open_dev = Tokens.load(host="127.0.0.1", dev=True, env={})
    async with serving_api(settings, open_dev) as url, \
            httpx.AsyncClient(base_url=url, timeout=20) as http:
        r = await http.post("/v1/tasks", json={"kind": "nothing"})
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]
        port = url.rsplit(":", 1)[1]
        cancel = f"/v1/sessions/{sid}/cancel"

        # A form posted from another site: no JSON, no preflight. Refused for its origin
        # and, from a page that sends none, for its body.
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        problem(await http.post(cancel, content=b"reason=x",
                                 headers={**form, "Origin": "http://evil.example"}),
                 403, "cross_origin")
        problem(await http.post(cancel, content=b"reason=x", headers=form), 415,
                 "json_required")
        problem(await http.post(cancel, content=b"{}", headers={"Content-Type": "text/plain"}),
                 415, "json_required")
        problem(await http.post(f"/v1/sessions/{sid}/runs/r-1/reject", content=b"",
                                 headers={"Content-Type": "text/plain"}), 415, "json_required")
        # A page that may send JSON (after a preflight the API never grants) is refused
        # for its origin all the same, as are sandboxed frames and files (Origin: null),
        # and a browser's word that the request comes from another site.
        json_body = {"Content-Type": "application/json"}
        for origin in ("http://evil.example", "null", f"http://127.0.0.1:{int(port) + 1}",
                       f"http://localhost:{port}"):
            problem(await http.post(cancel, json={}, headers={**json_body, "Origin": origin}),
                     403, "cross_origin")
        problem(await http.get("/v1/sessions", headers={"Origin": "http://evil.example"}),
                 403, "cross_origin")
        problem(await http.get("/v1/sessions", headers={"Sec-Fetch-Site": "cross-site",
                                                         "Sec-Fetch-Mode": "no-cors"}),
                 403, "cross_origin")

        # DNS rebinding: the page's own name, re-pointed at 127.0.0.1, is its origin too:
        # the Host header gives it away. Reads and writes alike.
        rebound = {"Host": f"rebind.example:{port}", "Origin": f"http://rebind.example:{port}"}
        problem(await http.get("/v1/sessions", headers=rebound), 400, "host_not_allowed")
        problem(await http.post(cancel, json={}, headers=rebound), 400, "host_not_allowed")
        problem(await http.get("/console/", headers={"Host": f"rebind.example:{port}"}),
                 400, "host_not_allowed")
        assert await _cancels(http, sid) == []  # nothing of all that reached the session

        # What the console sends passes: its own origin, a loopback name, JSON.
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
            same = {"Host": host, "Origin": f"http://{host}", "Sec-Fetch-Site": "same-origin"}
            assert (await http.get("/v1/whoami", headers=same)).status_code == 200
        top = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}  # a link to it
        assert (await http.get("/console/", headers=top)).status_code == 200
        ok = await http.post(cancel, json={}, headers={"Origin": url})
        assert ok.status_code == 200, ok.text
        assert await _cancels(http, sid) == ["*"]


async def test_a_configured_host_name_is_answered(settings: Settings) -> None:
    named = settings.model_copy(update={"api_hosts": "baton.internal"})
    async with serving_api(named, _tokens()) as url, \
            httpx.AsyncClient(base_url=url, timeout=20) as http:
        port = url.rsplit(":", 1)[1]
        r = await http.get("/v1/whoami", headers={**auth(READ),
                                                  "Host": f"baton.internal:{port}"})
        assert r.status_code == 200, r.text
        problem(await http.get("/v1/whoami", headers={**auth(READ),
                                                       "Host": "other.internal"}),
                 400, "host_not_allowed")


async def test_headers_docs_health_and_idempotency_keys(settings: Settings) -> None:
    async with serving_api(settings, _tokens()) as url, \
            httpx.AsyncClient(base_url=url, timeout=20) as http:
        # No page may frame the console or the API; each loads only what it must.
        for path in ("/console/", "/v1/whoami", "/docs", "/healthz", "/v1/nowhere"):
            r = await http.get(path, headers=auth(READ))
            csp = r.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in csp, (path, csp)
            assert r.headers["x-frame-options"] == "DENY"
            assert r.headers["x-content-type-options"] == "nosniff"
        console = await http.get("/console/")
        assert "script-src 'self';" in console.headers["content-security-policy"]
        assert "unsafe-inline" not in console.headers["content-security-policy"]
        assert "localStorage.setItem" not in (await http.get("/console/app.js")).text
        docs = await http.get("/docs")
        assert docs.status_code == 200
        assert f'src="{SWAGGER_UI["js"]}" integrity="{SWAGGER_UI["js_integrity"]}"' in docs.text
        assert f'href="{SWAGGER_UI["css"]}" integrity="{SWAGGER_UI["css_integrity"]}"' in \
            docs.text
        assert f"swagger-ui-dist@{SWAGGER_UI['version']}/" in docs.text
        assert "<script>" not in docs.text  # nothing inline: the policy refuses it
        assert (await http.get("/console/docs.js")).status_code == 200

        # Liveness to anyone, nothing more without a token.
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        assert (await http.get("/healthz", headers=auth("x" * 20))).json() == {"status": "ok"}
        inside = (await http.get("/healthz", headers=auth(READ))).json()
        assert inside["status"] == "ok" and inside["streams"] == 0
        # Readiness to anyone (a probe has no token; the k8s probe names Host: localhost):
        # the store answers, and nothing else is said.
        port = url.rsplit(":", 1)[1]
        for headers in ({}, {"Host": f"localhost:{port}"}, auth(READ)):
            ready = await http.get("/readyz", headers=headers)
            assert ready.status_code == 200 and ready.json() == {"status": "ready"}, ready.text

        # An Idempotency-Key names one request: sent again the same, the same answer;
        # with another body, refused rather than answered with the first one's.
        op = {**auth(OPERATE), "Idempotency-Key": "key-1"}
        body = {"text": "hello", "agent": "notices"}
        first = await http.post("/v1/submissions", json=body, headers=op)
        assert first.status_code == 201, first.text
        again = await http.post("/v1/submissions", json=body, headers=op)
        assert again.status_code == 200 and again.json()["submission"] == \
            first.json()["submission"]
        other = problem(await http.post("/v1/submissions", json={**body, "agent": "other"},
                                         headers=op), 409, "conflict")
        assert "agent" in other["detail"] and "key-1" in other["detail"]
        problem(await http.post("/v1/submissions", json={**body, "text": "bye"}, headers=op),
                 409, "conflict")  # the store's own check
        tk = {**auth(OPERATE), "Idempotency-Key": "key-2"}
        task = {"kind": "nothing", "input": {"n": 1}}
        assert (await http.post("/v1/tasks", json=task, headers=tk)).status_code == 201
        assert (await http.post("/v1/tasks", json=task, headers=tk)).status_code == 200
        problem(await http.post("/v1/tasks", json={**task, "input": {"n": 2}}, headers=tk),
                 409, "conflict")

        # A receipt id is ASCII digits: other scripts' digits are not (int() reads them).
        sid = first.json()["submission"]["session_id"]
        arabic_indic = "\u0661\u0662-\u0660"  # 12-0
        problem(await http.get(f"/v1/sessions/{sid}/events", params={"after": arabic_indic},
                                headers=auth(READ)), 422, "invalid_request")


def _watch_connections(clients: str, sid: str) -> int:
    return sum(1 for line in clients.splitlines() if f"name=baton-watch:{sid} " in line)


@pytest.mark.timeout(60)
async def test_event_streams_are_capped_and_old_ids_share_the_pool(
    settings: Settings, redis: Any,
) -> None:
    capped = settings.model_copy(update={"api_max_streams": 3, "api_max_streams_per_token": 2})
    async with serving_api(capped, _tokens()) as url, \
            httpx.AsyncClient(base_url=url, timeout=20) as http:
        sid, _ = await _task(http, "k-streams")
        for n in range(3):  # three more changes to resume between
            r = await http.post(f"/v1/sessions/{sid}/cancel",
                                json={"reason": f"change {n}"}, headers=auth(OPERATE))
            assert r.status_code == 200, r.text
        events = f"/v1/sessions/{sid}/events"

        async with http.stream("GET", events, headers=auth(READ)) as live:
            reader = SseReader(live)
            event, _, newest = await reader.next()
            assert event == "snapshot" and newest is not None
            # The session's feed follows it from the snapshot on: one watch connection.
            await eventually(lambda: _count(redis, sid, 1), timeout=15)

            # Two streams resume from before the feed started (the first receipt): each is
            # caught up over the pooled connections, then joins the feed. Neither adds a
            # Redis connection of its own.
            first_id = await _first_receipt(http, sid)
            async with http.stream("GET", events, headers={**auth(OTHER_READ),
                                                           "Last-Event-ID": first_id}) as a, \
                    http.stream("GET", events, headers={**auth(OPERATE),
                                                        "Last-Event-ID": first_id}) as b:
                readers = [SseReader(a), SseReader(b)]  # kept: a reader dropped closes its stream
                for resumed in readers:
                    assert (await resumed.next())[0] == "resume"
                    ids = []
                    while newest not in ids:
                        _, _, ident = await resumed.next()
                        if ident is not None:
                            ids.append(ident)
                    assert ids[0] != first_id and len(ids) == len(set(ids))
                assert _watch_connections(await _client_list(redis), sid) == 1

                # Three open: the fourth is refused whoever asks, with when to retry.
                refused = await http.get(events, headers=auth(READ))
                problem(refused, 429, "too_many_streams")
                assert refused.headers["retry-after"].isdigit()
            # Two left: a token's own cap still holds (READ has one open, may open one more).
            async with http.stream("GET", events, headers=auth(READ)) as second:
                assert second.status_code == 200
                problem(await http.get(events, headers=auth(READ)), 429, "too_many_streams")
            health = (await http.get("/healthz", headers=auth(READ))).json()
            assert health["streams"] == 1
        # Every slot is given back once its stream ended.
        await eventually(lambda: _healthz_streams(http, 0), timeout=15)


async def _healthz_streams(http: httpx.AsyncClient, n: int) -> bool:
    return bool((await http.get("/healthz", headers=auth(READ))).json()["streams"] == n)


async def _client_list(redis: Any) -> str:
    raw = await redis.execute_command("CLIENT", "LIST")
    return raw.decode() if isinstance(raw, bytes) else str(raw)


async def _count(redis: Any, sid: str, n: int) -> bool:
    return _watch_connections(await _client_list(redis), sid) == n


async def _first_receipt(http: httpx.AsyncClient, sid: str) -> str:
    trace = (await http.get(f"/v1/sessions/{sid}/trace", headers=auth(READ))).json()
    return str(trace["events"][0]["stream_id"])
