"""The console's store views in a real browser: a key created, used, revoked and refused;
usage downloaded as CSV equal to the ledger's rows."""

from __future__ import annotations

import asyncio
import csv
import io
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
import grpc
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from fairq.v1 import scheduler_pb2_grpc
from fairq_server.config.schema import ConsoleConfig
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, sim_backend
from ..http.console.browser import DOCS, chrome, until
from ..http.console.conftest import generate, session_csrf
from .helpers import read_rows, store_config

ROOT = {"Authorization": "Bearer root-key"}


async def _generate(channel: grpc.aio.Channel, secret: str) -> str:
    call = scheduler_pb2_grpc.SchedulerStub(channel).Generate(
        generate(tier="standard"), metadata=(("authorization", f"Bearer {secret}"),)
    )
    last = ""
    async for event in call:
        last = event.WhichOneof("event")
    return last


def _create_key(driver: object, url: str, user: str) -> str:
    d = driver  # selenium's Chrome
    d.get(f"{url}/console/login")  # type: ignore[attr-defined]
    d.find_element(By.ID, "key").send_keys("root-key", Keys.ENTER)  # type: ignore[attr-defined]
    until(d, lambda x: x.current_url.endswith("/console/queues"))  # type: ignore[arg-type]
    d.get(f"{url}/console/keys")  # type: ignore[attr-defined]
    d.find_element(By.ID, "user").send_keys(user)  # type: ignore[attr-defined]
    d.find_element(By.ID, "team").send_keys("research", Keys.ENTER)  # type: ignore[attr-defined]
    secret = until(d, lambda x: x.find_element(By.CSS_SELECTOR, "output.secret").text)  # type: ignore[arg-type]
    return str(secret)


def _revoke(driver: object, user: str) -> str:
    d = driver
    button = d.find_element(By.CSS_SELECTOR, f"button[aria-label^='revoke the key of {user}']")  # type: ignore[attr-defined]
    button.click()
    notice = until(d, lambda x: x.find_element(By.CSS_SELECTOR, "p.notice").text)  # type: ignore[arg-type]
    d.save_screenshot(str(DOCS / "keys.png"))  # type: ignore[attr-defined]
    return str(notice)


def _audit_rows(driver: object, url: str) -> list[list[str]]:
    d = driver
    d.get(f"{url}/console/audit")  # type: ignore[attr-defined]
    rows = d.find_elements(By.CSS_SELECTOR, "main table tbody tr")  # type: ignore[attr-defined]
    cells = [[c.text for c in r.find_elements(By.TAG_NAME, "td")] for r in rows]
    d.save_screenshot(str(DOCS / "audit.png"))  # type: ignore[attr-defined]
    return cells


@pytest.mark.timeout(120)
async def test_key_created_used_revoked_refused_and_usage_csv_matches_the_ledger(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    url_db = f"sqlite:///{tmp_path / 'fairq.db'}"
    config = store_config(url_db, [sim_backend(sim)], keys=tuple(KEYS.values()))
    config = replace(config, console=ConsoleConfig(enabled=True, refresh_seconds=0.25))
    server = await fairq_factory(config)
    url = f"http://127.0.0.1:{server.http_port}"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        with chrome(tmp_path / "profile") as driver:
            secret = await asyncio.to_thread(_create_key, driver, url, "carol")
            assert secret and "carol" in driver.page_source
            assert await _generate(channel, secret) == "finished"
            assert await _generate(channel, "alice-key") == "finished"
            notice = await asyncio.to_thread(_revoke, driver, "carol")
            assert "revoked" in notice
            # The next request with the revoked key is refused.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _generate(channel, secret)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED

            # Usage, by user, once the ledger holds the two finished requests.
            deadline = time.monotonic() + 10
            while len(await read_rows(url_db)) < 2:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)  # the ledger flushes every 0.05 s
            await asyncio.to_thread(driver.get, f"{url}/console/usage?by=user&since=1h")
            text = await asyncio.to_thread(lambda: driver.find_element(By.ID, "main").text)
            assert "carol" in text and "alice" in text
            await asyncio.to_thread(driver.save_screenshot, str(DOCS / "usage.png"))
            plotted = {
                g.get_attribute("data-group"): sum(
                    float(v) for v in g.get_attribute("data-values").split(",")
                )
                for g in driver.find_elements(By.CSS_SELECTOR, "svg.plot g[data-group]")
            }
            link = driver.find_element(By.LINK_TEXT, "Download as CSV").get_attribute("href")
            audit = await asyncio.to_thread(_audit_rows, driver, url)
        async with (
            aiohttp.ClientSession() as http,
            http.get(str(link), headers=ROOT) as resp,
        ):
            assert resp.status == 200 and resp.content_type == "text/csv"
            table = list(csv.DictReader(io.StringIO(await resp.text())))
    rows = await read_rows(url_db)
    expected = {}
    for row in rows:
        name = row["user_name"]
        got = expected.setdefault(name, [0, 0])
        got[0] += row["input_tokens"]
        got[1] += row["output_tokens"]
    assert {r["name"]: [int(r["input_tokens"]), int(r["output_tokens"])] for r in table} == expected
    assert {r["name"] for r in table} == {"carol", "alice"}
    # The plot over the last hour, of requests served here, sums to the same output tokens.
    assert plotted == {name: float(got[1]) for name, got in expected.items()}
    # The audit view lists what the admin did here, newest first, with who did it.
    assert [(r[1], r[2], r[3]) for r in audit] == [
        ("root", "console", "key.revoke"),
        ("root", "console", "key.create"),
        ("root", "console", "console.login"),
    ]
    assert audit[0][4] == audit[1][4]  # the key revoked is the key created
    assert audit[1][5] == "user carol, team research, tiers all"


async def test_key_forms_need_the_session_its_csrf_token_and_this_origin(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    url_db = f"sqlite:///{tmp_path / 'fairq.db'}"
    config = store_config(url_db, [sim_backend(sim)], keys=tuple(KEYS.values()))
    server = await fairq_factory(replace(config, console=ConsoleConfig(enabled=True)))
    url = f"http://127.0.0.1:{server.http_port}"
    assert server.store is not None
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        form = {"user": "mallory", "csrf": ""}
        # No session: refused, whatever the headers (a bearer admin key does not post forms).
        async with http.post(f"{url}/console/keys", data=form, headers=ROOT) as resp:
            assert resp.status == 401
        csrf = await session_csrf(http, url, "keys")
        for origin, token in (("http://evil.example", csrf), (url, "wrong")):
            async with http.post(
                f"{url}/console/keys", data={**form, "csrf": token}, headers={"Origin": origin}
            ) as resp:
                assert resp.status == 403
        assert await server.store.keys.list(include_revoked=True) == []
        async with http.post(
            f"{url}/console/keys", data={**form, "csrf": csrf}, headers={"Origin": url}
        ) as resp:
            assert resp.status == 200 and "shown this once" in await resp.text()
        [key] = await server.store.keys.list()
        assert key.user == "mallory"


async def test_a_live_stream_of_a_revoked_stored_bearer_key_ends(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    """A script reading the live views with a stored admin key loses them when it is revoked."""
    url_db = f"sqlite:///{tmp_path / 'fairq.db'}"
    config = store_config(url_db, [sim_backend(sim)], keys=tuple(KEYS.values()))
    console = ConsoleConfig(enabled=True, refresh_seconds=0.2)
    server = await fairq_factory(replace(config, console=console))
    assert server.store is not None
    key, secret = await server.store.keys.create("ops", admin=True)
    url = f"http://127.0.0.1:{server.http_port}"
    bearer = {"Authorization": f"Bearer {secret}"}
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{url}/console/events?view=queues", headers=bearer) as events,
    ):
        assert events.status == 200
        async with asyncio.timeout(20):
            assert (await events.content.readline()).startswith(b"data: ")
        assert await server.store.keys.revoke(key.id) is not None
        lines = []
        async with asyncio.timeout(20):
            while line := await events.content.readline():
                lines.append(line.strip())
        assert [line for line in lines if line][-2:] == [b"event: logout", b"data: {}"]
