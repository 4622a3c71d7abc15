"""The console's teams view in a real headless browser: a team's weight and a hard quota set
with the keyboard, listed, in force (the next request over the quota is refused with 429) and
in the audit log. Takes ``teams.png``."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from fairq_server.config.schema import ConsoleConfig
from fairq_server.tenancy.teams import team_weights
from fairq_sim import SimServer

from ...conftest import KEYS, FairqFactory, sim_backend
from ...store.helpers import store_config
from .browser import DOCS, chrome, until
from .conftest import session_csrf
from .test_browser import _log_in


def _notice(driver: webdriver.Chrome) -> str:
    found = until(
        driver, lambda d: d.find_element(By.CSS_SELECTOR, "main p.notice, main p.error").text
    )
    return str(found)


def _set_weight(driver: webdriver.Chrome, url: str, team: str, weight: str) -> str:
    driver.get(f"{url}/console/teams")
    label = driver.find_element(By.CSS_SELECTOR, "label[for=team-weight]")
    assert "Weight" in label.text  # labelled fields
    driver.find_element(By.ID, "team-name").send_keys(team)
    driver.find_element(By.ID, "team-weight").send_keys(weight, Keys.ENTER)  # keyboard only
    return _notice(driver)


def _weight_underflows(driver: webdriver.Chrome, url: str, weight: str) -> bool:
    driver.get(f"{url}/console/teams")
    driver.find_element(By.ID, "team-name").send_keys("blue")
    driver.find_element(By.ID, "team-weight").send_keys(weight, Keys.ENTER)
    assert driver.current_url.endswith("/console/teams")  # not posted
    assert not driver.find_elements(By.CSS_SELECTOR, "main p.notice, main p.error")
    return bool(
        driver.execute_script(
            "return document.getElementById('team-weight').validity.rangeUnderflow"
        )
    )


def _add_quota(driver: webdriver.Chrome, url: str, user: str) -> str:
    driver.get(f"{url}/console/teams")
    Select(driver.find_element(By.ID, "kind")).select_by_value("quota")
    Select(driver.find_element(By.ID, "scope")).select_by_value("user")
    driver.find_element(By.ID, "name").send_keys(user)
    driver.find_element(By.ID, "requests_per_minute").send_keys("1", Keys.ENTER)
    return _notice(driver)


def _rows(driver: webdriver.Chrome, url: str, path: str) -> list[list[str]]:
    driver.get(f"{url}{path}")
    rows = driver.find_elements(By.CSS_SELECTOR, "main table tbody tr")
    return [[c.text for c in r.find_elements(By.TAG_NAME, "td")] for r in rows]


async def _chat(port: int, key: str) -> int:
    body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=headers) as r,
    ):
        await r.read()
        return r.status


@pytest.mark.timeout(120)
async def test_set_a_weight_and_a_hard_quota_in_the_console(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    config = store_config(f"sqlite:///{tmp_path / 'fairq.db'}", [sim_backend(sim)],
                          keys=tuple(KEYS.values()))  # fmt: skip
    config = replace(config, console=ConsoleConfig(enabled=True, refresh_seconds=0.25))
    server = await fairq_factory(config)
    url = f"http://127.0.0.1:{server.http_port}"
    with chrome(tmp_path / "profile") as driver:
        await asyncio.to_thread(_log_in, driver, url, "root-key")
        await asyncio.to_thread(until, driver, lambda d: d.current_url.endswith("/console/queues"))
        # A weight of 0 is refused by the field itself (the server refuses it too, see below);
        # nothing is posted, nothing changes.
        underflow = await asyncio.to_thread(_weight_underflows, driver, url, "0")
        assert underflow is True
        assert team_weights(server.core.config.teams).weight("blue") == 1.0
        notice = await asyncio.to_thread(_set_weight, driver, url, "blue", "2.5")
        assert "Team blue has weight 2.5" in notice
        assert team_weights(server.core.config.teams).weight("blue") == 2.5
        teams = await asyncio.to_thread(_rows, driver, url, "/console/teams")
        assert ["blue", "2.5", "store", "Delete"] in teams
        # A hard quota of one request a minute for alice: her second request is refused.
        notice = await asyncio.to_thread(_add_quota, driver, url, "alice")
        assert "The quota of user alice is in force" in notice
        rows = await asyncio.to_thread(_rows, driver, url, "/console/teams")
        assert ["quota", "user alice", "all", "requests_per_minute=1, hard", "store", "Delete"] in (
            rows
        )
        await asyncio.to_thread(driver.save_screenshot, str(DOCS / "teams.png"))
        assert await _chat(server.http_port, "alice-key") == 200
        assert await _chat(server.http_port, "alice-key") == 429
        assert await _chat(server.http_port, "bob-key") == 200  # nobody else
        audit = await asyncio.to_thread(_rows, driver, url, "/console/audit")
    assert [(r[1], r[2], r[3], r[4], r[5]) for r in audit[:2]] == [
        ("root", "console", "limit.set", "quota user 'alice' model *",
         "requests_per_minute=1, hard"),
        ("root", "console", "team.set", "blue", "weight 2.5"),
    ]  # fmt: skip


async def test_team_forms_need_the_session_its_csrf_token_and_this_origin(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    config = store_config(f"sqlite:///{tmp_path / 'fairq.db'}", [sim_backend(sim)],
                          keys=tuple(KEYS.values()))  # fmt: skip
    server = await fairq_factory(replace(config, console=ConsoleConfig(enabled=True)))
    url = f"http://127.0.0.1:{server.http_port}"
    assert server.managed is not None
    form = {"team-name": "mallory", "team-weight": "9"}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        # A non-admin gets no page; no session posts nothing, whatever the headers.
        alice = {"Authorization": "Bearer alice-key"}
        async with http.get(f"{url}/console/teams", headers=alice) as resp:
            assert resp.status == 403
        root = {"Authorization": "Bearer root-key"}
        async with http.post(f"{url}/console/teams/team", data=form, headers=root) as resp:
            assert resp.status == 401
        csrf = await session_csrf(http, url, "teams")
        for origin, token in (("http://evil.example", csrf), (url, "wrong")):
            async with http.post(
                f"{url}/console/teams/team", data={**form, "csrf": token},
                headers={"Origin": origin},
            ) as resp:  # fmt: skip
                assert resp.status == 403
        assert server.managed.effective().teams == ()
        # With both, a weight is set, then deleted from the page's own form.
        async with http.post(
            f"{url}/console/teams/team", data={**form, "csrf": csrf}, headers={"Origin": url}
        ) as resp:
            assert resp.status == 200 and "Team mallory has weight 9" in await resp.text()
        assert team_weights(server.core.config.teams).weight("mallory") == 9.0
        async with http.post(
            f"{url}/console/teams/team-delete", data={"name": "mallory", "csrf": csrf},
            headers={"Origin": url},
        ) as resp:  # fmt: skip
            assert "The stored weight of team mallory is deleted" in await resp.text()
        assert team_weights(server.core.config.teams).weight("mallory") == 1.0
        # A limit the file's rules refuse is said on the page, naming the field.
        bad = {"kind": "quota", "scope": "user", "name": "al", "tokens_per_day": "1.5",
               "csrf": csrf}  # fmt: skip
        async with http.post(
            f"{url}/console/teams/limit", data=bad, headers={"Origin": url}
        ) as resp:
            page = await resp.text()
            assert "quota.tokens_per_day must be a whole number" in page
        # The refused form keeps what was typed (it was cleared before).
        assert '<input id="name" name="name" type="text" required value="al">' in page
        assert 'id="tokens_per_day" name="tokens_per_day" type="number"' in page
        assert 'step="1" value="1.5">' in page
        assert '<option value="user" selected>user</option>' in page
        # A weight of 0 is refused by the field itself (it allowed 0), and by the server.
        assert 'step="any" min="0.000001" required>' in page
        zero = {"team-name": "mallory", "team-weight": "0", "csrf": csrf}
        async with http.post(
            f"{url}/console/teams/team", data=zero, headers={"Origin": url}
        ) as resp:
            page = await resp.text()
        assert "weight must be a finite number above 0" in page
        assert 'type="text" required value="mallory">' in page
        assert 'min="0.000001" required value="0">' in page
        async with http.post(
            f"{url}/console/teams/limit-delete",
            data={"kind": "quota", "scope": "user", "name": "al", "csrf": csrf},
            headers={"Origin": url},
        ) as resp:  # fmt: skip
            assert "the store has no quota of user &#x27;al&#x27;" in await resp.text()
    audit = await server.store.audit.recent(3) if server.store else []
    assert [a.action for a in audit] == ["team.delete", "team.set", "console.login"]
