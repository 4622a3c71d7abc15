"""The console in a real headless browser: a team over its quota is marked in the queue view.

Takes ``queues-entitlement.png`` (under ``docs/console/`` with
``FAIRQ_SCREENSHOTS=docs/console``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from selenium import webdriver

from fairq_sim import SimServer

from ...conftest import FairqFactory
from .browser import DOCS, chrome, until
from .test_browser import _live_text, _log_in
from .test_entitlement import start_limited, use_quotas


def _team_row(driver: webdriver.Chrome, team: str) -> dict[str, str]:
    # One script call: the fragment may be replaced between a find and a read.
    found = driver.execute_script(
        "const r = document.querySelector(`#live tr[data-team='${arguments[0]}']`);"
        "return r ? {state: r.dataset.state, text: r.innerText} : null;",
        team,
    )
    return dict(found) if isinstance(found, dict) else {}


def _marks(driver: webdriver.Chrome) -> list[str]:
    # One script call, as _team_row: a refresh pushed between a find and a read replaced the
    # elements found (StaleElementReferenceException in one run of the full suite).
    found = driver.execute_script(
        "return [...document.querySelectorAll('#live [data-team-over]')].map(m => m.innerText);"
    )
    return [str(m) for m in found] if isinstance(found, list) else []


@pytest.mark.timeout(120)
async def test_a_team_over_its_quota_is_marked(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    server = await start_limited(sim, fairq_factory)
    url = f"http://127.0.0.1:{server.http_port}"
    with chrome(tmp_path / "profile") as driver:
        await asyncio.to_thread(_log_in, driver, url, "root-key")
        await asyncio.to_thread(until, driver, lambda d: d.current_url.endswith("/console/queues"))
        # No request yet: every team within its limits.
        await asyncio.to_thread(until, driver, lambda d: _team_row(d, "ops").get("state") == "ok")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            waiting = await use_quotas(server, channel)
            # Pushed over server-sent events, no reload: ops at its hard daily quota.
            await asyncio.to_thread(
                until, driver, lambda d: _team_row(d, "ops").get("state") == "over"
            )
            ops = await asyncio.to_thread(_team_row, driver, "ops")
            assert "at limit — refused until 2027-01-16 00:00:00 UTC" in ops["text"]
            assert (await asyncio.to_thread(_team_row, driver, "research"))["state"] == "warn"
            # The waiting users' rows: cy's team over its soft quota, ann over her own.
            await asyncio.to_thread(until, driver, lambda d: "cy" in _live_text(d))
            assert await asyncio.to_thread(_marks, driver) == ["team over quota"]
            text = await asyncio.to_thread(_live_text, driver)
            assert "over quota — idle-only band" in text
            assert "near limit (80 % or more)" in text
            await asyncio.to_thread(driver.save_screenshot, str(DOCS / "queues-entitlement.png"))
            for call in waiting:
                call.cancel()
