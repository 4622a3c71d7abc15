"""A real headless Chromium (Debian's package) driven through Selenium, for the console tests.

Selenium runs synchronously: tests call it through :func:`asyncio.to_thread`, so the fairq
server on the test's event loop keeps serving while the browser waits on it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.wait import WebDriverWait

__all__ = ["DOCS", "chrome", "until"]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# The screenshots go to docs/console/ only when asked (FAIRQ_SCREENSHOTS=docs/console): a test
# run leaves the checkout as it found it. Otherwise they are still taken, into a scratch folder.
DOCS = Path(os.environ.get("FAIRQ_SCREENSHOTS") or Path(tempfile.gettempdir()) / "fairq-console")
DOCS.mkdir(parents=True, exist_ok=True)

# No network beyond loopback, no background updates, no sandbox (containers), one profile
# directory per test.
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1366,860",
)


@contextmanager
def chrome(profile: Path) -> Iterator[webdriver.Chrome]:
    """Start Chromium with a fresh profile in ``profile``; quit it at the end."""
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        if os.environ.get("FAIRQ_CI"):
            pytest.fail(
                "chromium and chromium-driver are required (FAIRQ_CI is set): make chromium"
            )
        pytest.skip("needs Debian's chromium and chromium-driver (make chromium)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in _FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def until(
    driver: webdriver.Chrome, condition: Callable[[webdriver.Chrome], object], timeout: float = 30
) -> object:
    """Wait until ``condition(driver)`` is truthy (polled by Selenium); return it.

    The live fragment is replaced on every refresh, so an element found a moment ago may be
    gone when read: that is polled again, like an element not there yet.
    """
    ignored = (NoSuchElementException, StaleElementReferenceException)
    wait = WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=ignored)
    return wait.until(condition)
