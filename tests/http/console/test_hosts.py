"""The console answers only to its own host names, and believes forwarded headers only from
trusted proxies: DNS rebinding, the ``Secure`` cookie behind a TLS proxy."""

from __future__ import annotations

import aiohttp
import pytest

from fairq_server.config.loader import parse_config
from fairq_server.errors import ConfigError
from fairq_sim import SimServer

from ...conftest import FairqFactory
from .conftest import start_console


def _session() -> aiohttp.ClientSession:
    # unsafe: keep cookies set by an IP address (the door listens on 127.0.0.1).
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def test_a_page_of_another_name_resolving_here_gets_nothing_in_open_mode(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """DNS rebinding: ``evil.example`` resolves to 127.0.0.1, so its page is same-origin with
    itself; in open mode (every caller an admin) it could log in and read the CSRF token."""
    door = await start_console(fairq_factory, sim, keys=False)
    port = door.server.http_port
    evil = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    async with _session() as http:
        async with http.post(
            f"{door.url}/console/login", data={"key": "anything"}, headers=evil,
            allow_redirects=False,
        ) as resp:  # fmt: skip
            assert resp.status == 421
            assert "fairq_console" not in resp.cookies
            text = await resp.text()
            assert "evil.example" in text and "console.allowed_hosts" in text
        for path in ("/console/queues", "/console/login", "/console/static/console.js"):
            async with http.get(f"{door.url}{path}", headers=evil) as resp:
                assert resp.status == 421, path
        for path in ("/console/api/live", "/console/events?view=queues"):
            async with http.get(f"{door.url}{path}", headers=evil) as resp:
                assert resp.status == 421, path
                assert "evil.example" in (await resp.json())["error"]
        # The loopback names, on any port, are the default (open mode: any bearer is admin).
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST."):
            headers = {"Host": host, "Authorization": "Bearer anything"}
            async with http.get(f"{door.url}/console/api/live", headers=headers) as resp:
                assert resp.status == 200, host


async def test_configured_names_replace_the_loopback_ones(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    door = await start_console(
        fairq_factory, sim, allowed_hosts=("console.example", f"127.0.0.1:{65535}")
    )
    port = door.server.http_port
    root = {"Authorization": "Bearer root-key"}
    async with aiohttp.ClientSession() as http:
        for host, status in (
            (f"console.example:{port}", 200),
            ("console.example", 200),
            (f"127.0.0.1:{port}", 421),  # only on port 65535
            (f"localhost:{port}", 421),
            (f"evil.console.example:{port}", 421),
        ):
            headers = {**root, "Host": host}
            async with http.get(f"{door.url}/console/api/live", headers=headers) as resp:
                assert resp.status == status, host


async def test_a_forwarded_host_counts_only_from_a_trusted_proxy(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    root = {"Authorization": "Bearer root-key"}
    for proxies, status in (((), 421), (("127.0.0.0/8",), 200)):
        door = await start_console(
            fairq_factory, sim, http={"trusted_proxies": proxies},
            allowed_hosts=("console.example",),
        )  # fmt: skip
        # The proxy speaks to fairq by its loopback address and says what the browser asked.
        headers = {
            **root, "Host": f"127.0.0.1:{door.server.http_port}",
            "X-Forwarded-Host": "console.example",
        }  # fmt: skip
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{door.url}/console/api/live", headers=headers) as resp,
        ):
            assert resp.status == status, proxies


async def _login(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> aiohttp.ClientResponse:
    return await http.post(
        f"{url}/console/login", data={"key": "root-key"}, headers=headers, allow_redirects=False
    )


async def test_the_cookie_is_secure_behind_a_trusted_tls_proxy_only(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    trusting = await start_console(fairq_factory, sim, http={"trusted_proxies": ("127.0.0.1",)})
    host = trusting.url.removeprefix("http://")
    https = {"Origin": f"https://{host}", "X-Forwarded-Proto": "https"}
    async with _session() as http:
        resp = await _login(http, trusting.url, https)
        assert resp.status == 303
        assert resp.cookies["fairq_console"]["secure"]
        # A Secure cookie is not sent over plain HTTP by a client: the proxy would send it.
        cookie = {"Cookie": f"fairq_console={resp.cookies['fairq_console'].value}"}
        async with http.get(f"{trusting.url}/console/queues", headers=cookie) as page:
            csrf = (await page.text()).split('name="csrf" value="')[1].split('"')[0]
        async with http.post(
            f"{trusting.url}/console/logout", data={"csrf": csrf}, headers={**https, **cookie},
            allow_redirects=False,
        ) as out:  # fmt: skip
            assert out.status == 303
            cleared = out.cookies["fairq_console"]
            assert cleared.value == "" and cleared["secure"] and cleared["max-age"] == "0"
        # Through the trusted proxy the scheme is known: an http:// page is another origin.
        resp = await _login(http, trusting.url, {**https, "Origin": f"http://{host}"})
        assert resp.status == 403
        # Several proxies: the last value is the trusted one's.
        resp = await _login(http, trusting.url, {**https, "X-Forwarded-Proto": "https, http"})
        assert resp.status == 403
        # Plain HTTP to the door itself: no Secure cookie (the browser would not send it back).
        resp = await _login(http, trusting.url, {"Origin": trusting.url})
        assert resp.status == 303 and not resp.cookies["fairq_console"]["secure"]
    untrusting = await start_console(fairq_factory, sim)
    host = untrusting.url.removeprefix("http://")
    async with _session() as http:
        # Anyone may send X-Forwarded-Proto: from a peer that is not a trusted proxy it is
        # ignored (and the scheme of the Origin with it, as before).
        resp = await _login(
            http, untrusting.url, {"Origin": f"https://{host}", "X-Forwarded-Proto": "https"}
        )
        assert resp.status == 303 and not resp.cookies["fairq_console"]["secure"]


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"console": {"allowed_hosts": []}}, r"console\.allowed_hosts must name at least one"),
        (
            {"console": {"allowed_hosts": ["ok", "http://x/"]}},
            r"console\.allowed_hosts\[1\]: 'http://x/' is not a host",
        ),
        ({"console": {"allowed_hosts": ["x:99999"]}}, r"console\.allowed_hosts\[0\]"),
        (
            {"http": {"listen": "127.0.0.1:0", "trusted_proxies": ["10.0.0.0/8", "proxy"]}},
            r"http\.trusted_proxies: 'proxy' is not an IP address or network",
        ),
    ],
)
def test_bad_host_names_and_proxies_are_refused_naming_the_entry(
    section: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(section)


def test_the_defaults_are_the_loopback_names_and_no_proxy() -> None:
    config = parse_config({"http": {"listen": "127.0.0.1:0"}, "console": {"enabled": True}})
    assert config.console.allowed_hosts == ("localhost", "127.0.0.1", "::1")
    assert config.http.trusted_proxies == ()
