"""The console in a real browser: headless Chromium (Debian's chromium and chromium-driver)
driven by Selenium, nothing downloaded. The ``browser`` fixture (tests/conftest.py) skips a
test where they are not installed; these helpers wait on what the page shows."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
T = TypeVar("T")


def chromium(*extra: str) -> Iterator[Any]:
    """A headless Chromium's WebDriver, quit afterwards (the ``browser`` fixture's body);
    ``extra``: more command-line switches (e.g. ``--host-resolver-rules=...``)."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("Chromium or its WebDriver is not installed (Debian: apt-get install "
                    "chromium chromium-driver; scripts/bootstrap.sh installs them as root)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,800", "--hide-scrollbars", "--no-first-run",
                "--disable-extensions", "--disable-background-networking", *extra):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


async def in_thread(fn: Callable[[], T]) -> T:
    """Selenium blocks: its calls run beside the event loop that supervises the stack."""
    return await asyncio.to_thread(fn)


def wait(driver: Any, condition: Callable[[Any], Any], timeout: float, what: str) -> Any:
    """Poll ``condition`` until truthy; an element the live page re-rendered meanwhile (stale)
    or has not drawn yet is asked for again."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1,
                             ignored_exceptions=[StaleElementReferenceException]).until(condition)
    except TimeoutException:
        raise AssertionError(f"the console did not show {what} within {timeout}s") from None


def count(driver: Any, css: str) -> int:
    from selenium.webdriver.common.by import By

    return len(driver.find_elements(By.CSS_SELECTOR, css))
