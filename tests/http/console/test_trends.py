"""The trends view: queue depth, waits, time to first token and tokens per second over the
recent past, from a bounded ring sampled in the process, drawn as small SVG lines."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import grpc

from fairq_sim import SimServer

from ...conftest import FairqFactory, freeze_gate
from .conftest import generate, start_console, stub

ALICE = (("authorization", "Bearer alice-key"),)
ROOT = {"Authorization": "Bearer root-key"}


def _figures(page: str) -> dict[tuple[str, str], list[str]]:
    """Each figure's values, by (group, name), read from the page's SVG."""
    found = re.findall(
        r'<figure class="trend" data-group="([^"]*)" data-name="([^"]*)">'
        r'<svg class="spark"[^>]*data-values="([^"]*)"',
        page,
    )
    return {(group, name): values.split(",") for group, name, values in found}


async def test_trends_show_the_queue_waits_and_tokens_and_stay_bounded(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    door = await start_console(fairq_factory, sim, history_seconds=0.05, history_points=6)
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{door.server.port}") as channel,
        aiohttp.ClientSession(headers=ROOT) as http,
    ):

        async def figures() -> dict[tuple[str, str], list[str]]:
            async with http.get(f"{door.url}/console/trends") as resp:
                assert resp.status == 200
                return _figures(await resp.text())

        async def until(check: str, predicate: object) -> dict[tuple[str, str], list[str]]:
            deadline = asyncio.get_running_loop().time() + 60
            while True:  # samples are taken by the feed's task: polled, bounded
                found = await figures()
                if predicate(found):  # type: ignore[operator]
                    return found
                assert asyncio.get_running_loop().time() < deadline, (check, found)
                await asyncio.sleep(0.05)

        sched = stub(channel)
        async for _event in sched.Generate(generate(max_tokens=8), metadata=ALICE):
            pass
        # The request's wait, time to first token and tokens appear in some sample.
        seen = await until(
            "served",
            lambda f: (
                any(v for v in f.get(("all", "tokens/s"), []))
                and any(v for v in f.get(("tier batch", "time to first token"), []))
            ),
        )
        assert ("tier batch", "queue wait") in seen
        assert any(float(v) > 0 for v in seen[("all", "tokens/s")] if v)
        assert ("user alice", "tokens/s") in seen
        # Then a queue builds: its depth is the last value of the model's line.
        await freeze_gate(door.server)
        calls = [sched.Generate(generate(), metadata=ALICE) for _ in range(3)]
        for call in calls:
            assert (await call.read()).WhichOneof("event") == "queued"
        seen = await until("queued", lambda f: f.get(("model sim", "queued"), [""])[-1] == "3")
        # The ring is bounded: six samples at most, however many were taken.
        assert all(len(values) <= 6 for values in seen.values())
        assert seen[("model sim", "running")][-1] == "0"
        # Per user and team (alice has none): queued, and the longest wait.
        assert seen[("user alice", "queued")][-1] == seen[("team none", "queued")][-1] == "3"
        assert float(seen[("user alice", "longest wait")][-1]) > 0
        async with http.get(f"{door.url}/console/trends") as resp:
            page = await resp.text()
        assert 'role="img" aria-label="model sim, queued: now 3' in page
        for call in calls:
            call.cancel()
