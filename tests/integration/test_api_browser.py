"""A hostile page in a real browser against the open dev API (every loopback caller an
operator: the worst case): headless Chromium (tests/browser.py), the API in this event loop
over real Redis and NATS.

Chromium resolves two names of the test's own to 127.0.0.1 (``--host-resolver-rules``):
``attacker.test``, the site of a page served by a small server here, and ``rebind.test``, a
name that DNS rebinding would have re-pointed at the loopback. The page posts forms to the
API's ``/cancel`` and ``/reject`` (a form needs no CORS preflight); a script on a page of
``rebind.test`` at the API's own port reads and cancels with JSON, same-origin in the
browser's eyes. Every one is refused, and the session is untouched; the console's own
origin, in the same browser, then cancels (so the refusals are the API's, not the browser's).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from baton.api.auth import Tokens
from baton.devkit.servers import free_port
from baton.settings import Settings
from tests.api_helpers import serving_api
from tests.browser import chromium, in_thread, wait

pytestmark = pytest.mark.timeout(120)

RESOLVE = ("--host-resolver-rules=MAP attacker.test 127.0.0.1, MAP rebind.test 127.0.0.1",
           # plain http to these names: no attempt at https first
           "--disable-features=HttpsUpgrades,HttpsFirstBalancedModeAutoEnable")


@pytest.fixture
def hostile_browser() -> Iterator[Any]:
    yield from chromium(*RESOLVE)


class _Pages:
    """A server of HTML pages by path (the attacker's site), in a thread."""

    def __init__(self) -> None:
        self.pages: dict[str, str] = {}
        pages = self.pages

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.get(self.path, "not here").encode()
                self.send_response(200 if self.path in pages else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Pages:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _form(action: str) -> str:
    """A page that posts a form to ``action`` as it loads (text/plain shaped as JSON)."""
    return f"""<!doctype html><html><body>
<form id="f" method="POST" action="{action}" enctype="text/plain">
<input type="hidden" name='{{"reason": "' value='gotcha"}}'></form>
<script>document.getElementById("f").submit();</script></body></html>"""


_FETCH = """const done = arguments[arguments.length - 1];
(async () => {
  const read = await fetch("/v1/sessions");
  const cancel = await fetch(arguments[0], {method: "POST",
    headers: {"Content-Type": "application/json"}, body: "{}"});
  done([read.status, cancel.status, (await cancel.json()).code]);
})().catch((e) => done(String(e)));"""


async def test_a_hostile_page_and_a_rebinding_name_are_refused(
    settings: Settings, hostile_browser: Any,
) -> None:
    open_dev = Tokens.load(host="127.0.0.1", dev=True, env={})
    with _Pages() as site:
        async with serving_api(settings, open_dev) as url, \
                httpx.AsyncClient(base_url=url, timeout=20) as http:
            await _attack(hostile_browser, url, http, site)


async def _attack(driver: Any, url: str, http: httpx.AsyncClient, site: _Pages) -> None:
    r = await http.post("/v1/tasks", json={"kind": "nothing"})
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    port = url.rsplit(":", 1)[1]
    cancel = f"/v1/sessions/{sid}/cancel"
    site.pages["/cancel"] = _form(f"{url}{cancel}")
    site.pages["/reject"] = _form(f"{url}/v1/sessions/{sid}/runs/r-1/reject")

    async def cancels() -> list[str]:
        return list((await http.get(f"/v1/sessions/{sid}")).json()["cancel_intents"])

    # The attacker's page posts its forms: the browser shows the API's refusal.
    for page in ("/cancel", "/reject"):
        await in_thread(lambda page=page: driver.get(f"http://attacker.test:{site.port}{page}"))
        await in_thread(lambda: wait(driver, lambda d: "cross_origin" in d.page_source, 15,
                                     "the API refusing the cross-site form"))
    assert await cancels() == []

    # DNS rebinding: rebind.test at the API's port. The page itself is refused, and a
    # script running at that origin can neither read nor cancel.
    rebound = f"http://rebind.test:{port}"
    await in_thread(lambda: driver.get(f"{rebound}/console/"))
    await in_thread(lambda: wait(driver, lambda d: "host_not_allowed" in d.page_source, 15,
                                 "the API refusing the rebound name"))
    got = await in_thread(lambda: driver.execute_async_script(_FETCH, cancel))
    assert got == [400, 400, "host_not_allowed"], got
    assert await cancels() == []

    # The console's own origin, in the same browser: answered.
    await in_thread(lambda: driver.get(f"{url}/console/#/sessions"))
    got = await in_thread(lambda: driver.execute_async_script(_FETCH, cancel))
    assert got[:2] == [200, 200], got
    assert await cancels() == ["*"]
