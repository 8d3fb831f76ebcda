"""The web console in a real browser: headless Chromium (Debian's chromium and
chromium-driver) driven by Selenium against a stack with the API, nothing downloaded.

The five-notice task is submitted from the page against the approval-gated app; each send is
approved from the page (through the confirmation dialog); the Hands that sends is SIGKILLed
after its third send took effect, and the page's timeline, fed over Server-Sent Events, shows
the takeover by a clean Hands and its confirmation (the mail service is asked, nothing is
sent twice) as they are committed. The mail service's counts are checked at the end. The
screenshots in docs/console/ (used by the docs) are written by this test when
``BATON_SCREENSHOTS`` names that folder (`make screenshots`); otherwise they go to a
temporary folder, so a test run leaves the checkout as it was.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.browser import count, in_thread, wait
from tests.crash.conftest import SETTLE_S, Opener

pytestmark = [pytest.mark.crash, pytest.mark.timeout(180)]

APP = "tests.control_apps:approval_app"
ONE_AT_A_TIME = {"BATON_HANDS_CONCURRENCY": "1"}


def _shot(driver: Any, name: str) -> Path:
    chosen = os.environ.get("BATON_SCREENSHOTS")
    shots = Path(chosen) if chosen else Path(tempfile.gettempdir()) / "baton-console"
    shots.mkdir(parents=True, exist_ok=True)
    path = shots / name
    driver.save_screenshot(str(path))
    return path


def _approve_first(driver: Any) -> str:
    """Click Approve on the first waiting run, confirm in the dialog; its run id."""
    from selenium.webdriver.common.by import By

    # The list is redrawn as receipts arrive: find the card again if it went stale.
    run_id = wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "#approvals .approval")
                   .get_attribute("data-run"), 10, "a waiting approval")
    card = f'#approvals .approval[data-run="{run_id}"] button.approve'

    def click(d: Any) -> bool:
        d.find_element(By.CSS_SELECTOR, card).click()
        return True

    wait(driver, click, 10, f"run {run_id}'s approve button")
    dialog = wait(driver, lambda d: d.find_element(By.ID, "confirm").is_displayed(), 10,
                   "the confirmation dialog")
    assert dialog
    assert run_id in driver.find_element(By.ID, "confirm-body").text
    driver.find_element(By.ID, "confirm-yes").click()
    wait(driver, lambda d: count(d, f'#approvals .approval[data-run="{run_id}"]') == 0, 15,
          f"run {run_id} leaving the approvals")
    return str(run_id)


async def test_console_submits_approves_and_shows_a_takeover_live(
    crash: Opener, browser: Any,
) -> None:
    from selenium.webdriver.common.by import By

    c = await crash(brains=1, hands=0, relays=1, app_spec=APP, api=True)
    armed = await c.spawn_armed("hands", "hands.after_effect@3", env=ONE_AT_A_TIME)
    driver = browser
    # The address `baton dev` prints: the stack's token in the fragment, kept by the tab.
    await in_thread(lambda: driver.get(
        f"{c.stack.api_url}/console/#token={c.stack.api_token}"))
    await in_thread(lambda: wait(driver, lambda d: "operate" in d.find_element(
        By.ID, "role").text, 15, "the operate role of the stack's token"))
    assert "#/sessions" in driver.current_url and "token" not in driver.current_url
    assert driver.execute_script("return localStorage.getItem('baton.token')") is None

    # Submit the five-notice task from the page: it opens the session's page.
    await in_thread(lambda: driver.find_element(By.ID, "submit-button").click())
    await in_thread(lambda: wait(driver, lambda d: "#/session/" in d.current_url, 15,
                                   "the new session's page"))
    sid = str(driver.current_url).rsplit("/", 1)[1]
    await in_thread(lambda: wait(driver, lambda d: count(d, "#approvals .approval") == 5, 30,
                                   "five sends awaiting approval"))
    await in_thread(lambda: wait(driver, lambda d: "live on" in (d.find_element(
        By.ID, "live").get_attribute("class") or ""), 10, "the live event stream"))
    await in_thread(lambda: driver.execute_script(
        "document.getElementById('approval-card').scrollIntoView()"))
    await in_thread(lambda: _shot(driver, "approvals.png"))
    before_kill = await in_thread(lambda: count(driver, "#timeline-svg g.event"))

    # Approve every send from the page; the armed Hands dies after its third took effect.
    approved = [await in_thread(lambda: _approve_first(driver)) for _ in range(5)]
    assert len(set(approved)) == 5
    await c.died_at(armed.name, "hands.after_effect")
    await c.replace(armed.name, env=ONE_AT_A_TIME)

    # The page follows: the takeover of the abandoned send and its confirmation appear.
    await in_thread(lambda: wait(driver, lambda d: count(d, "#notable .flag-takeover") >= 1,
                                   SETTLE_S, "the takeover"))
    await in_thread(lambda: wait(driver, lambda d: count(d, "#notable .flag-confirm") >= 1,
                                   SETTLE_S, "the confirmation"))
    await in_thread(lambda: wait(driver, lambda d: count(
        d, "[data-submission] .st-completed") == 1, SETTLE_S, "the completed submission"))
    await in_thread(lambda: wait(driver, lambda d: count(
        d, '#runs tr[data-status="applied"]') == 5, SETTLE_S, "five applied runs"))
    after = await in_thread(lambda: count(driver, "#timeline-svg g.event"))
    assert after > before_kill
    assert await in_thread(lambda: count(driver, "#timeline-svg g.flag-takeover")) >= 1
    changes = await in_thread(lambda: count(driver, "tr.change"))
    assert changes > 0  # rows the page took from the event stream, not from a reload
    await in_thread(lambda: driver.execute_script(
        "document.getElementById('timeline').scrollIntoView()"))
    await in_thread(lambda: _shot(driver, "session.png"))

    # The mail service: each recipient got one mail, the uncertain send was not repeated.
    await c.check_exactly_once(raw_requests=5)
    (sub_id,) = await c.store.redis.hkeys(c.store.keys.session(sid).subs)  # the one submitted
    final = await c.store.inbox.submission(sid, sub_id)
    assert final.status == "completed"

    # The other pages: sessions (live status), workers with their levels, dead letters.
    await in_thread(lambda: driver.get(f"{c.stack.api_url}/console/#/sessions"))
    await in_thread(lambda: wait(driver, lambda d: count(
        d, f'#sessions tr[data-session="{sid}"] .st-settled') == 1, 15, "the settled session"))
    await in_thread(lambda: _shot(driver, "sessions.png"))
    await in_thread(lambda: driver.get(f"{c.stack.api_url}/console/#/workers"))
    await in_thread(lambda: wait(driver, lambda d: count(d, "#levels tbody tr") >= 1
                                   and count(d, "#workers tbody tr") >= 3, 15, "the workers"))
    await in_thread(lambda: _shot(driver, "workers.png"))
    await in_thread(lambda: driver.get(f"{c.stack.api_url}/console/#/dead-letters"))
    await in_thread(lambda: wait(driver, lambda d: "kept" in d.find_element(
        By.CSS_SELECTOR, "main .card p").text, 15, "the dead letters"))
    logs = await in_thread(lambda: driver.get_log("browser"))
    assert not [e for e in logs if e.get("level") == "SEVERE"], logs
