"""Who gets the console: admins only; sessions, CSRF and the cookie's flags."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp
import pytest

from fairq_server.config.loader import parse_config
from fairq_server.errors import ConfigError

from ..conftest import Door

PAGES = ["/console/queues", "/console/backends", "/console/cluster"]
DATA = ["/console/api/live", "/console/events?view=queues"]


def _session() -> aiohttp.ClientSession:
    # unsafe: keep cookies set by an IP address (the door listens on 127.0.0.1).
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def _login(http: aiohttp.ClientSession, url: str, key: str) -> aiohttp.ClientResponse:
    return await http.post(
        f"{url}/console/login", data={"key": key}, headers={"Origin": url}, allow_redirects=False
    )


async def test_console_is_off_unless_configured(door: Door) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{door.url}/console/queues", allow_redirects=False) as resp,
    ):
        assert resp.status == 404


def test_console_needs_the_http_door() -> None:
    on = parse_config({"http": {"listen": "127.0.0.1:0"}, "console": {"enabled": True}})
    assert on.console.enabled and on.console.refresh_seconds == 1.0
    with pytest.raises(ConfigError, match=r"console\.enabled needs the HTTP door"):
        parse_config({"console": {"enabled": True}})
    with pytest.raises(ConfigError, match=r"console\.refresh_seconds must be above 0"):
        parse_config({"http": {"listen": "127.0.0.1:0"}, "console": {"refresh_seconds": 0}})


async def test_anonymous_caller_gets_no_page_and_no_data(console: Door) -> None:
    async with _session() as http:
        for path in PAGES:
            async with http.get(f"{console.url}{path}", allow_redirects=False) as resp:
                assert (resp.status, resp.headers["Location"]) == (303, "/console/login")
        for path in DATA:
            async with http.get(f"{console.url}{path}") as resp:
                assert resp.status == 401
                assert "fairq" not in (await resp.text()).replace("fairq console", "")


async def test_non_admin_key_gets_403_everywhere(console: Door) -> None:
    alice = {"Authorization": "Bearer alice-key"}
    async with _session() as http:
        for path in PAGES + DATA:
            async with http.get(f"{console.url}{path}", headers=alice) as resp:
                assert resp.status == 403, path
        resp = await _login(http, console.url, "alice-key")
        assert resp.status == 403
        assert "not an admin" in await resp.text()
        assert "fairq_console" not in resp.cookies
        # Still nothing after the refused login.
        async with http.get(f"{console.url}/console/api/live") as resp:
            assert resp.status == 401


async def test_admin_logs_in_with_an_httponly_strict_cookie_and_logs_out(console: Door) -> None:
    async with _session() as http:
        resp = await _login(http, console.url, "root-key")
        assert (resp.status, resp.headers["Location"]) == (303, "/console/queues")
        cookie = resp.cookies["fairq_console"]
        assert cookie["httponly"] and cookie["samesite"] == "Strict"
        assert cookie["path"] == "/console" and "root-key" not in cookie.value
        async with http.get(f"{console.url}/console/queues") as page:
            assert page.status == 200
            html = await page.text()
            assert "Signed in as <strong>root</strong>" in html
            assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
        async with http.get(f"{console.url}/console/api/live") as data:
            assert data.status == 200
            [view] = (await data.json())["replicas"]
            assert [b["id"] for b in view["backends"]] == ["sim-a"]
        csrf = html.split('name="csrf" value="')[1].split('"')[0]
        # A logout posted from another site, or without the form's token, is refused.
        for headers, token in (
            ({"Origin": "http://evil.example"}, csrf),
            ({"Origin": console.url}, "x"),
        ):
            async with http.post(
                f"{console.url}/console/logout", data={"csrf": token}, headers=headers,
                allow_redirects=False,
            ) as refused:  # fmt: skip
                assert refused.status == 403
        async with http.get(f"{console.url}/console/api/live") as data:
            assert data.status == 200  # still logged in
        async with http.post(
            f"{console.url}/console/logout", data={"csrf": csrf}, headers={"Origin": console.url},
            allow_redirects=False,
        ) as out:  # fmt: skip
            assert (out.status, out.headers["Location"]) == (303, "/console/login")
        async with http.get(f"{console.url}/console/api/live") as data:
            assert data.status == 401


async def test_login_posted_from_another_site_is_refused(console: Door) -> None:
    async with _session() as http:
        for headers in ({"Origin": "http://evil.example"}, {}):
            async with http.post(
                f"{console.url}/console/login", data={"key": "root-key"}, headers=headers,
                allow_redirects=False,
            ) as resp:  # fmt: skip
                assert resp.status == 403
                assert "fairq_console" not in resp.cookies


async def test_wrong_key_is_told_and_gets_no_session(console: Door) -> None:
    async with _session() as http:
        resp = await _login(http, console.url, "nope")
        assert resp.status == 401
        assert "invalid API key" in await resp.text()


async def test_admin_bearer_header_reads_the_data_without_a_session(console: Door) -> None:
    async with aiohttp.ClientSession() as http:
        root = {"Authorization": "Bearer root-key"}
        async with http.get(f"{console.url}/console/api/live", headers=root) as resp:
            assert resp.status == 200


async def test_login_through_a_tls_terminating_proxy_is_same_origin(console: Door) -> None:
    """The browser's origin is https:// while fairq sees plain HTTP with the same Host."""
    host = console.url.removeprefix("http://")
    async with _session() as http:
        resp = await http.post(
            f"{console.url}/console/login", data={"key": "root-key"},
            headers={"Origin": f"https://{host}"}, allow_redirects=False,
        )  # fmt: skip
        assert resp.status == 303
        resp = await http.post(
            f"{console.url}/console/login", data={"key": "root-key"},
            headers={"Origin": f"https://{host}.evil.example"}, allow_redirects=False,
        )  # fmt: skip
        assert resp.status == 403


async def test_a_key_removed_by_reload_ends_its_sessions_at_the_next_push(console: Door) -> None:
    """The credential is checked at every push: the open page is told to log out."""
    async with _session() as http:
        assert (await _login(http, console.url, "root-key")).status == 303
        async with http.get(f"{console.url}/console/events?view=backends") as events:
            assert events.status == 200
            first = await events.content.readline()
            assert first.startswith(b"data: ") and b"sim-a" in first
            config = console.server.config
            keys = tuple(k for k in config.keys if k.user != "root")
            await console.server.reload(replace(config, keys=keys))
            lines = []
            async with asyncio.timeout(10):
                while b"event: logout" not in lines[-1:]:
                    lines.append((await events.content.readline()).strip())
        async with http.get(f"{console.url}/console/api/live") as resp:
            assert resp.status == 401
        async with http.get(f"{console.url}/console/queues", allow_redirects=False) as resp:
            assert resp.headers["Location"] == "/console/login"
