"""The console in a real headless browser: log in, watch a flood queue up and drain.

The screenshots under ``docs/console/`` are taken here, from the pages as the test sees them
(``FAIRQ_SCREENSHOTS=docs/console``).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from fairq_server.config.schema import ConsoleConfig, HttpConfig, TierConfig
from fairq_sim import SimConfig, SimServer

from ...conftest import KEYS, FairqFactory, make_config, sim_backend
from .browser import DOCS, chrome, until
from .conftest import generate, stub

ALICE = (("authorization", "Bearer alice-key"),)
BOB = (("authorization", "Bearer bob-key"),)
RUNNING_ALICE = '#live tr[data-user="alice"]:not([data-running="0"])'


def _live_text(driver: webdriver.Chrome) -> str:
    # Read in one script call: the fragment may be replaced between a find and a read.
    return str(driver.execute_script("return document.getElementById('live').innerText"))


def _log_in(driver: webdriver.Chrome, url: str, key: str) -> None:
    driver.get(f"{url}/console/queues")  # anonymous: sent to the login form
    assert driver.current_url.endswith("/console/login")
    field = driver.find_element(By.ID, "key")
    # The field is labelled (screen readers, and a click on the label focuses it).
    label = driver.find_element(By.CSS_SELECTOR, "label[for=key]")
    assert "Admin API key" in label.text
    field.send_keys(key)
    field.send_keys(Keys.ENTER)  # keyboard only


@pytest.mark.timeout(180)
async def test_flood_appears_in_the_queue_view_and_drains(
    fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    # A slow backend with two slots, and a batch tier that forwards only to an empty backend
    # queue: a flood waits in fairq, where the console shows it.
    sim_config = SimConfig(mode="vllm", model="sim", speed=1.0, max_num_seqs=2)
    async with SimServer(sim_config) as sim:
        tiers = (
            TierConfig("interactive", max_backend_waiting=0),
            TierConfig("standard", max_backend_waiting=0),
            TierConfig("batch", max_backend_waiting=0),
        )
        config = replace(
            make_config([sim_backend(sim)], keys=list(KEYS.values())),
            tiers=tiers,
            http=HttpConfig(listen="127.0.0.1:0"),
            console=ConsoleConfig(
                enabled=True, refresh_seconds=0.25, starved_after_seconds=2.0, history_seconds=0.5
            ),
        )
        server = await fairq_factory(config)
        url = f"http://127.0.0.1:{server.http_port}"
        with chrome(tmp_path / "profile") as driver:
            await asyncio.to_thread(driver.get, f"{url}/console/login")
            await asyncio.to_thread(driver.save_screenshot, str(DOCS / "login.png"))
            await asyncio.to_thread(_log_in, driver, url, "root-key")
            await asyncio.to_thread(
                until, driver, lambda d: d.current_url.endswith("/console/queues")
            )
            assert "Nobody is waiting" in await asyncio.to_thread(_live_text, driver)
            # Keyboard: the first Tab reaches the skip link, the next the views' navigation.
            assert await asyncio.to_thread(_tab_order, driver) == ["Skip to the content", "Queues"]
            # A mark on the page: still there at the end means no reload happened.
            await asyncio.to_thread(driver.execute_script, "window.fairqMark = 1")

            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                sched = stub(channel)
                # Alice alone first: all the recent service is hers, and owed to her (nobody
                # else contended), so it does not make her over.
                warm = [sched.Generate(generate(max_tokens=8), metadata=ALICE) for _ in range(2)]
                assert await asyncio.gather(*map(_drain, warm)) == ["finished"] * 2
                # The flood lasts while the browser looks (at full speed it drains in 2 s, less
                # than a loaded machine's browser may take to show it): the engine crawls until
                # the views have been read.
                sim.config.speed = 0.02
                calls = [sched.Generate(generate(max_tokens=48), metadata=ALICE) for _ in range(24)]
                reading = [asyncio.create_task(_drain(call)) for call in calls]
                # Alice's first requests take the backend's slots: listed with requests running
                # (only running, if the gate let every one through before the metrics said so).
                await asyncio.to_thread(
                    until, driver, lambda d: d.find_elements(By.CSS_SELECTOR, RUNNING_ALICE)
                )
                # Then bob floods too: alice's running requests go on while he waits, so her
                # share of the minute passes what she was owed (half of it since he came).
                more = [sched.Generate(generate(max_tokens=48), metadata=BOB) for _ in range(6)]
                calls += more
                reading += [asyncio.create_task(_drain(call)) for call in more]

                # The flood shows up, pushed over server-sent events: alice's and bob's rows.
                await asyncio.to_thread(
                    until, driver, lambda d: "alice" in _live_text(d) and "bob" in _live_text(d)
                )
                text = await asyncio.to_thread(_live_text, driver)
                assert "Model sim:" in text and "batch" in text
                await asyncio.to_thread(
                    until, driver, lambda d: re.search(r"\bover\b", _live_text(d)), 90
                )
                await asyncio.to_thread(driver.save_screenshot, str(DOCS / "queues.png"))
                # Meanwhile, in another tab: the backend busy, fairq's requests in flight.
                await asyncio.to_thread(_backends_tab, driver, url)
                # And the trends: the queue's depth over the last samples, drawn.
                await asyncio.to_thread(_trends_tab, driver, url)
                # Then it drains.
                sim.config.speed = 1.0
                outcomes = await asyncio.gather(*reading)
                assert outcomes == ["finished"] * len(calls)
                await asyncio.to_thread(
                    until, driver, lambda d: "Nobody is waiting" in _live_text(d)
                )
            assert await asyncio.to_thread(driver.execute_script, "return window.fairqMark") == 1

            # Logging out ends the session: the pages send the browser back to the login form.
            await asyncio.to_thread(
                lambda: driver.find_element(By.CSS_SELECTOR, ".logout button").click()
            )
            await asyncio.to_thread(
                until, driver, lambda d: d.current_url.endswith("/console/login")
            )
            await asyncio.to_thread(driver.get, f"{url}/console/backends")
            assert driver.current_url.endswith("/console/login")


def _tab_order(driver: webdriver.Chrome) -> list[str]:
    body = driver.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.TAB)
    first = driver.switch_to.active_element.text
    driver.switch_to.active_element.send_keys(Keys.TAB)
    return [first, driver.switch_to.active_element.text]


def _backends_tab(driver: webdriver.Chrome, url: str) -> None:
    queues = driver.current_window_handle
    driver.switch_to.new_window("tab")
    driver.get(f"{url}/console/backends")
    in_flight = "#live tbody tr td:nth-child(7)"  # fairq's requests on the backend
    until(driver, lambda d: d.find_element(By.CSS_SELECTOR, in_flight).text not in ("", "0"))
    text = _live_text(driver)
    assert "sim-a" in text and "up" in text
    driver.save_screenshot(str(DOCS / "backends.png"))
    driver.close()
    driver.switch_to.window(queues)


def _trends_tab(driver: webdriver.Chrome, url: str) -> None:
    queues = driver.current_window_handle
    driver.switch_to.new_window("tab")
    driver.get(f"{url}/console/trends")
    queued = '#live figure[data-group="model sim"][data-name="queued"] svg'
    until(driver, lambda d: d.find_element(By.CSS_SELECTOR, queued).get_attribute("data-last"))
    # Drawn: a line, in the page's SVG (read back, not a picture of it).
    assert driver.find_elements(By.CSS_SELECTOR, f"{queued} polyline")
    # Per user: alice's waits (her first requests' at least), and her time to first token.
    for name in ("queue wait", "time to first token"):
        line = f'#live figure[data-group="user alice"][data-name="{name}"] svg'
        until(
            driver,
            lambda d, line=line: d.find_element(By.CSS_SELECTOR, line).get_attribute("data-last"),
        )
        last = driver.find_element(By.CSS_SELECTOR, line).get_attribute("data-last")
        assert 0 <= float(last or "nan") < 600, (name, last)
    driver.save_screenshot(str(DOCS / "trends.png"))
    driver.close()
    driver.switch_to.window(queues)


async def _drain(call: grpc.aio.UnaryStreamCall) -> str:  # type: ignore[type-arg]
    last = ""
    async for event in call:
        last = event.WhichOneof("event")
    return last
