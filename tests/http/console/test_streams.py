"""A live stream (``/console/events``) ends with what let it open, within the feed's period.

Logged out (in this tab or another one sharing the cookie), expired, or a bearer credential
that stopped working: the stream says ``event: logout`` and ends, instead of pushing views to
a browser that is no longer allowed to see them.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp
import pytest

from fairq_sim import SimServer

from ...conftest import FairqFactory
from ..conftest import Door
from .conftest import session_csrf, start_console


def _session() -> aiohttp.ClientSession:
    # unsafe: keep cookies set by an IP address (the door listens on 127.0.0.1).
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def _first_frame(events: aiohttp.ClientResponse) -> None:
    assert events.status == 200
    async with asyncio.timeout(20):
        first = await events.content.readline()
    assert first.startswith(b"data: ")


async def _rest(events: aiohttp.ClientResponse) -> list[bytes]:
    """Read the stream to its end (a stream that does not end fails the test)."""
    lines = []
    async with asyncio.timeout(20):
        while line := await events.content.readline():
            if line.strip():
                lines.append(line.strip())
    return lines


async def test_logout_ends_the_streams_of_every_tab(console: Door) -> None:
    url = console.url
    async with _session() as http:
        csrf = await session_csrf(http, url, "queues")
        # Two tabs of one browser: one cookie, two streams.
        async with (
            http.get(f"{url}/console/events?view=queues") as one,
            http.get(f"{url}/console/events?view=backends") as two,
        ):
            await _first_frame(one)
            await _first_frame(two)
            async with http.post(
                f"{url}/console/logout", data={"csrf": csrf}, headers={"Origin": url},
                allow_redirects=False,
            ) as out:  # fmt: skip
                assert out.status == 303
            for events in (one, two):
                rest = await _rest(events)
                assert rest[-2:] == [b"event: logout", b"data: {}"]


async def test_an_expired_session_ends_its_stream(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    door = await start_console(fairq_factory, sim, session_seconds=4.0)
    async with _session() as http:
        await session_csrf(http, door.url, "queues")
        async with http.get(f"{door.url}/console/events?view=queues") as events:
            await _first_frame(events)
            rest = await _rest(events)  # the session's 4 s run out meanwhile
            assert rest[-2:] == [b"event: logout", b"data: {}"]
        async with http.get(f"{door.url}/console/api/live") as resp:
            assert resp.status == 401


@pytest.mark.parametrize("how", ["removed", "demoted"])
async def test_a_bearer_whose_key_stops_working_loses_its_stream(console: Door, how: str) -> None:
    """No session to close: the bearer header itself is checked again at every push."""
    root = {"Authorization": "Bearer root-key"}
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{console.url}/console/events?view=queues", headers=root) as events,
    ):
        await _first_frame(events)
        config = console.server.config
        if how == "removed":
            keys = tuple(k for k in config.keys if k.user != "root")
        else:
            keys = tuple(replace(k, admin=False) for k in config.keys)
        await console.server.reload(replace(config, keys=keys))
        rest = await _rest(events)
        assert rest[-2:] == [b"event: logout", b"data: {}"]
