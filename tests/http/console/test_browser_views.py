"""The queue view in a real headless browser: long and spoofing names, and refreshes that
leave the page alone where nothing changed.

Before: a 300-character user widened the page to 3,292 px; a name holding U+202E was
rendered reversed (spoofing another); every refresh replaced the whole fragment (a text
selection was lost each second) and rewrote the status region (a screen reader announced
every refresh).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from fairq_server.config.schema import ConsoleConfig, HttpConfig, KeyConfig
from fairq_server.identity.auth import hash_key
from fairq_sim import SimServer

from ...conftest import KEYS, FairqFactory, freeze_gate, make_config, sim_backend
from .browser import chrome, until
from .conftest import generate, stub
from .test_browser import _log_in

LONG = "long" + "o" * 296  # one word of 300 characters: nowhere to break but anywhere
SPOOF = "admin\u202egnp."  # reads "admin.png" where the override is obeyed
USERS = {"long-key": LONG, "spoof-key": SPOOF}

# Selects the long name's text in its cell, marks the cell, and counts changes to the status
# region and refreshes (the update time beside it).
_SELECT = """
const cell = [...document.querySelectorAll('#live td')].find(td => td.textContent === arguments[0]);
const range = document.createRange();
range.selectNodeContents(cell);
const selection = window.getSelection();
selection.removeAllRanges();
selection.addRange(range);
window.fairqCell = cell;
window.fairqAnnounced = 0;
window.fairqRefreshes = 0;
new MutationObserver(() => window.fairqAnnounced++).observe(
  document.getElementById('status'), {childList: true, characterData: true, subtree: true});
new MutationObserver(() => window.fairqRefreshes++).observe(
  document.getElementById('updated'), {childList: true, characterData: true, subtree: true});
"""
_AFTER = """
return {selected: window.getSelection().toString(), kept: document.contains(window.fairqCell),
        announced: window.fairqAnnounced, refreshes: window.fairqRefreshes,
        live: document.getElementById('live').getAttribute('aria-live')};
"""


def _widths(driver: webdriver.Chrome) -> tuple[int, int]:
    return tuple(  # type: ignore[return-value]
        driver.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
    )


@pytest.mark.timeout(120)
async def test_long_and_spoofing_names_and_a_selection_that_survives_refreshes(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    keys = [*KEYS.values(), *(KeyConfig(user, hash_key(key)) for key, user in USERS.items())]
    config = replace(
        make_config([sim_backend(sim)], keys=keys),
        http=HttpConfig(listen="127.0.0.1:0"),
        console=ConsoleConfig(enabled=True, refresh_seconds=0.2),
    )
    server = await fairq_factory(config)
    url = f"http://127.0.0.1:{server.http_port}"
    await freeze_gate(server)  # the requests stay queued: the rows stay on the page
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        sched = stub(channel)
        calls = [
            sched.Generate(generate(), metadata=(("authorization", f"Bearer {key}"),))
            for key in USERS
        ]
        for call in calls:
            assert (await call.read()).WhichOneof("event") == "queued"
        with chrome(tmp_path / "profile") as driver:
            await asyncio.to_thread(_log_in, driver, url, "root-key")
            await asyncio.to_thread(
                until, driver, lambda d: LONG in d.find_element("id", "live").text
            )
            # The page is as wide as the window: the name wraps.
            width, window = await asyncio.to_thread(_widths, driver)
            assert width <= window, (width, window)
            # The override is shown as a mark naming it, in the text and the attributes.
            html = await asyncio.to_thread(
                driver.execute_script, "return document.getElementById('live').innerHTML"
            )
            assert "admin⟦U+202E⟧gnp." in html and "\u202e" not in html
            # A selection made in the table is still there after refreshes (the waiting
            # times change every refresh; the name's cell does not), nothing is announced.
            await asyncio.to_thread(driver.execute_script, _SELECT, LONG)
            await asyncio.to_thread(
                until, driver, lambda d: d.execute_script("return window.fairqRefreshes") >= 3
            )
            after = await asyncio.to_thread(driver.execute_script, _AFTER)
            # Filtering and sorting hold across refreshes (the fragment is arranged before it
            # is merged in).
            arranged = await asyncio.to_thread(_filter_and_sort, driver)
        for call in calls:
            call.cancel()
    assert after["selected"] == LONG
    assert after["kept"] is True  # the very same cell, not a copy swapped in
    assert after["announced"] == 0
    assert after["live"] == "off"

    assert arranged["filtered"] == [LONG]  # the other row is hidden
    shown = "admin⟦U+202E⟧gnp."  # attributes carry the visible mark too
    assert arranged["ascending"] == [shown, LONG]
    assert arranged["descending"] == [LONG, shown]
    assert arranged["aria"] == "descending"


_ROWS = """
return [...document.querySelectorAll('#live tbody tr')].filter(r => !r.hidden)
  .map(r => r.dataset.user);
"""


def _refreshes(driver: webdriver.Chrome, more: int) -> None:
    seen = driver.execute_script("return window.fairqRefreshes")
    until(driver, lambda d: d.execute_script("return window.fairqRefreshes") >= seen + more)


def _filter_and_sort(driver: webdriver.Chrome) -> dict[str, object]:
    field = driver.find_element(By.ID, "filter")
    field.send_keys("GOOO")  # case does not matter
    _refreshes(driver, 2)
    filtered = driver.execute_script(_ROWS)
    field.clear()
    field.send_keys(" ")  # an input event with nothing to match: every row again
    header = driver.find_element(By.XPATH, "//div[@id='live']//thead//th[normalize-space()='User']")
    header.send_keys(Keys.ENTER)  # the keyboard sorts too
    _refreshes(driver, 2)
    ascending = driver.execute_script(_ROWS)
    header.click()
    _refreshes(driver, 2)
    return {
        "filtered": filtered,
        "ascending": ascending,
        "descending": driver.execute_script(_ROWS),
        "aria": header.get_attribute("aria-sort"),
    }
