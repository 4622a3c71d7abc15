"""The usage plot in a real browser shows the ledger's numbers: per team and hour, per model
and day, read back from the page's SVG (values, not pixels)."""

from __future__ import annotations

import asyncio
import csv
import io
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from fairq_server.config.schema import ConsoleConfig
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, sim_backend
from ..http.console.browser import DOCS, chrome, until
from .helpers import store_config
from .usage_rows import expected_series, row, write_rows


def _plotted(driver: Any, url: str, query: str) -> dict[str, Any]:
    """Open the usage view with ``query``; return what its plot says, per line."""
    driver.get(f"{url}/console/usage?{query}")
    until(driver, lambda d: d.find_element(By.CSS_SELECTOR, "svg.plot"))
    lines: dict[str, Any] = {}
    for g in driver.find_elements(By.CSS_SELECTOR, "svg.plot g[data-group]"):
        points = {
            int(c.get_attribute("data-start")): float(c.get_attribute("data-value"))
            for c in g.find_elements(By.TAG_NAME, "circle")
        }
        tips = [t.get_attribute("textContent") for t in g.find_elements(By.TAG_NAME, "title")]
        values = [float(v) for v in g.get_attribute("data-values").split(",")]
        lines[g.get_attribute("data-group")] = {"points": points, "values": values, "tips": tips}
    legend = [li.text for li in driver.find_elements(By.CSS_SELECTOR, "ul.legend li")]
    link = driver.find_element(By.PARTIAL_LINK_TEXT, "as CSV").get_attribute("href")
    series = driver.find_elements(By.PARTIAL_LINK_TEXT, "Download per")[0].get_attribute("href")
    return {"lines": lines, "legend": legend, "csv": link, "series_csv": series}


def _login(driver: Any, url: str) -> None:
    driver.get(f"{url}/console/login")
    driver.find_element(By.ID, "key").send_keys("root-key", Keys.ENTER)
    until(driver, lambda d: d.current_url.endswith("/console/queues"))


@pytest.mark.timeout(120)
async def test_usage_plot_shows_the_ledgers_sums_per_hour_and_per_day(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    url_db = f"sqlite:///{tmp_path / 'fairq.db'}"
    now = time.time()
    hour, day = 3600, 86400
    rows = [
        row(now - 60, "ann", "alpha", "m1", 120, cost=0.5),
        row(now - 90, "bob", "alpha", "m1", 30, cost=0.25),
        row(now - 3 * hour, "ann", "alpha", "m2", 45, cost=0.125),
        row(now - 7 * hour, "cy", "beta", "m1", 300, cost=1.5),
        row(now - 7 * hour - 60, "cy", "beta", "m2", 5),
        row(now - 30 * hour, "dee", None, "m2", 77, cost=2.0),  # in the days' plot only
    ]
    await write_rows(url_db, rows)
    config = store_config(url_db, [sim_backend(sim)], keys=tuple(KEYS.values()))
    server = await fairq_factory(replace(config, console=ConsoleConfig(enabled=True)))
    url = f"http://127.0.0.1:{server.http_port}"
    with chrome(tmp_path / "profile") as driver:
        await asyncio.to_thread(_login, driver, url)
        query = "by=team&since=24h&step=hour&measure=output_tokens"
        hourly = await asyncio.to_thread(_plotted, driver, url, query)
        await asyncio.to_thread(driver.save_screenshot, str(DOCS / "usage-plot.png"))
        daily = await asyncio.to_thread(
            _plotted, driver, url, "by=model&since=7d&step=day&measure=cost"
        )
    since = now - day
    want = expected_series(rows, "team", "output_tokens", hour, since, now + 60)
    assert set(hourly["lines"]) == {"alpha", "beta"}  # no row of no team in the last day
    for team, per_hour in want.items():
        line = hourly["lines"][team]
        assert line["points"] == per_hour
        assert sum(line["values"]) == sum(per_hour.values())
        assert len(line["values"]) in (24, 25)  # every hour of the range, empty ones too
    assert hourly["lines"]["alpha"]["points"][int((now - 60) // hour) * hour] == 150
    assert any(
        "alpha" in tip and "150 output tokens" in tip for tip in hourly["lines"]["alpha"]["tips"]
    )
    assert "alpha: 195 output tokens" in hourly["legend"]
    assert "beta: 305 output tokens" in hourly["legend"]

    want_cost = expected_series(rows, "model", "cost", day, now - 7 * day, now + 60)
    assert {m: line["points"] for m, line in daily["lines"].items()} == want_cost
    assert sum(daily["lines"]["m2"]["values"]) == pytest.approx(2.125)
    assert "m1: 2.2500 cost" in daily["legend"]

    # The per-bucket CSV linked under the plot has the same numbers, every measure.
    async with (
        aiohttp.ClientSession() as http,
        http.get(hourly["series_csv"], headers={"Authorization": "Bearer root-key"}) as resp,
    ):
        assert resp.status == 200 and resp.content_type == "text/csv"
        table = list(csv.DictReader(io.StringIO(await resp.text())))
    for measure in ("output_tokens", "input_tokens", "requests", "cost"):
        got: dict[str | None, dict[int, float]] = {}
        for r in table:
            start = int(
                datetime.strptime(r["bucket_start"], "%Y-%m-%dT%H:%M:%SZ")
                .replace(tzinfo=UTC)
                .timestamp()
            )
            if float(r[measure]):
                got.setdefault(r["name"], {})[start] = float(r[measure])
        assert got == expected_series(rows, "team", measure, hour, since, now + 60), measure
