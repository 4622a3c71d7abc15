"""The console shows preemptions: per backend (by reason, tokens generated again) and per user
(its requests running again after being preempted), from the counters fairq keeps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from fairq_server.config.preempt import PreemptConfig
from fairq_server.config.schema import DEFAULT_TIERS, ConsoleConfig, HttpConfig
from fairq_sim import SimConfig, SimServer

from ...conftest import KEYS, FairqFactory, make_config, sim_backend
from ..test_preemption_http import body, until
from .browser import DOCS, chrome
from .browser import until as until_shown

ROOT = {"Authorization": "Bearer root-key"}
SLOTS = 2


async def _stream(http: aiohttp.ClientSession, url: str, text: str, key: str) -> int:
    """Stream one completion with ``key``; return the events read."""
    headers = {"Authorization": f"Bearer {key}"}
    async with http.post(url, json=body(False, text, 400), headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        return len([line async for line in resp.content if line.startswith(b"data: ")])


@pytest.fixture
async def slow_sim() -> AsyncIterator[SimServer]:
    async with SimServer(SimConfig(mode="vllm", model="sim", speed=2.0, max_num_seqs=SLOTS)) as s:
        yield s


def _backends_page(driver: Any, url: str) -> str:
    """Log in, open the backends view; return its live part once it shows the preemption."""
    driver.get(f"{url}/console/login")
    driver.find_element(By.ID, "key").send_keys("root-key", Keys.ENTER)
    until_shown(driver, lambda d: d.current_url.endswith("/console/queues"))
    driver.get(f"{url}/console/backends")
    text = until_shown(
        driver, lambda d: "tier 1" in (t := d.find_element(By.ID, "live").text) and t
    )
    driver.save_screenshot(str(DOCS / "backends-preemptions.png"))
    return str(text)


@pytest.mark.timeout(120)
async def test_backends_view_counts_preemptions_and_the_users_resumed(
    slow_sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    tiers = tuple(
        replace(t, preempt_after_seconds=0.0, max_backend_waiting=0) for t in DEFAULT_TIERS
    )
    backend = sim_backend(slow_sim, preempt=True, max_in_flight=SLOTS)
    config = make_config(
        [backend], keys=list(KEYS.values()), preempt=PreemptConfig(min_tokens=4, max_per_second=100)
    )
    config = replace(
        config,
        tiers=tiers,
        http=HttpConfig(listen="127.0.0.1:0"),
        console=ConsoleConfig(enabled=True, refresh_seconds=0.2),
    )
    server = await fairq_factory(config)
    base = f"http://127.0.0.1:{server.http_port}"
    state = server.core.backend("sim-a")
    assert state is not None
    running = server.core.dispatcher.attempts.on_backend
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/console/api/live", headers=ROOT) as resp:
            [before] = (await resp.json())["replicas"][0]["backends"]
        assert (before["preemptions"], before["regenerated_tokens"], before["resumed"]) == (
            [],
            0,
            [],
        )
        url = f"{base}/v1/completions"
        power = [
            asyncio.create_task(_stream(http, url, f"power {i}", "alice-key")) for i in range(SLOTS)
        ]
        await until(
            lambda: state.in_flight == SLOTS and all(t.generating for t in running["sim-a"]), 30
        )
        light = body(False, "light", 4, stream=False)
        async with http.post(url, json=light, headers={"Authorization": "Bearer bob-key"}) as r:
            assert r.status == 200
            await r.read()
        # The preempted request runs again (its continuation) while the other one goes on.
        await until(
            lambda: any(
                t.progress is not None and t.progress.preemptions for t in running["sim-a"]
            ),
            30,
        )
        async with http.get(f"{base}/console/api/live", headers=ROOT) as resp:
            [after] = (await resp.json())["replicas"][0]["backends"]
        async with http.get(f"{base}/console/backends", headers=ROOT) as resp:
            page = await resp.text()
        await asyncio.gather(*power)
    regenerated = server.core.telemetry.preempt_regenerated.labels("sim-a")._value.get()
    assert after["preemptions"] == [["tier", 1]]  # bob's request is of a higher tier than alice's
    # Decoded twice: none where the continuation resumes token-exact, so only the page's
    # agreement with the counter is checked; the victim's output was re-read as prompt.
    assert after["regenerated_tokens"] == regenerated >= 0
    assert server.core.telemetry.preempt_resumed.labels("sim-a")._value.get() > 0
    assert after["resumed"] == [["alice", 1]]
    assert "1 (tier 1)" in page
    assert f"{int(regenerated)} tokens generated again" in page
    assert "running after preemption: alice (1)" in page
    with chrome(tmp_path / "profile") as driver:  # the same figures in a browser
        text = await asyncio.to_thread(_backends_page, driver, base)
    assert "1 (tier 1)" in text and f"{int(regenerated)} tokens generated again" in text
