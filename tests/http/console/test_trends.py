"""The trends view: queue depth, waits, time to first token and tokens per second over the
recent past, from a bounded ring sampled in the process, drawn as small SVG lines."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace

import aiohttp
import grpc

from fairq_server.config.schema import KeyConfig, TierConfig
from fairq_server.console.trends import trends_fragment
from fairq_server.identity.auth import hash_key
from fairq_server.observe.history import LiveHistory
from fairq_sim import SimConfig, SimServer

from ...conftest import FairqFactory, freeze_gate, make_config, sim_backend
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
        # The request's wait, time to first token and tokens appear in some sample (alice's
        # recent service is counted as her request's end is logged: maybe a sample later).
        seen = await until(
            "served",
            lambda f: (
                any(v for v in f.get(("all", "tokens/s"), []))
                and any(v for v in f.get(("tier batch", "time to first token"), []))
                and ("user alice", "tokens/s") in f
            ),
        )
        assert ("tier batch", "queue wait") in seen
        assert any(float(v) > 0 for v in seen[("all", "tokens/s")] if v)
        assert ("user alice", "tokens/s") in seen
        # Per user and per team (alice has none): her request's wait and time to first token,
        # in the sample of the interval it was dispatched in.
        seen = await until(
            "alice's waits",
            lambda f: (
                any(v for v in f.get(("user alice", "time to first token"), []))
                and any(v for v in f.get(("team none", "time to first token"), []))
            ),
        )
        for group in ("user alice", "team none"):
            waits = [float(v) for v in seen[(group, "queue wait")] if v]
            ttfts = [float(v) for v in seen[(group, "time to first token")] if v]
            assert len(waits) == len(ttfts) == 1, seen  # one request: one interval says it
            assert 0 <= waits[0] <= ttfts[0] < 60, seen  # the first token came after dispatch
        # Nobody else waited: no "other users" line.
        assert ("user", "queue wait") not in seen
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


async def test_waits_per_user_keep_the_five_who_waited_most_and_the_others_together(
    fairq_factory: FairqFactory,
) -> None:
    """Eight users of four teams wait one behind the other: five lines, and "others".

    The samples are taken by the test (a history of its own over the server's core, the
    console off so that nothing else takes the sums): all eight requests in one interval.
    """
    users = [f"u{i}" for i in range(8)]
    keys = [KeyConfig(u, hash_key(f"{u}-key"), team=f"t{i // 2}") for i, u in enumerate(users)]
    # One running slot, nothing queued on the backend: each waits for the one before it.
    async with SimServer(SimConfig(mode="vllm", model="sim", speed=20.0, max_num_seqs=1)) as sim:
        config = replace(
            make_config([sim_backend(sim)], keys=keys),
            tiers=(TierConfig("batch", max_backend_waiting=0),),
        )
        server = await fairq_factory(config)
        history = LiveHistory(server.core, server.request_log.recent)
        history.sample()  # the first sample: the next one has an interval
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            sched = stub(channel)

            async def one(user: str) -> None:
                metadata = (("authorization", f"Bearer {user}-key"),)
                async for _event in sched.Generate(generate(max_tokens=2), metadata=metadata):
                    pass

            await asyncio.gather(*(one(u) for u in users))
        history.sample()
    trends = {(t.group, t.name): t.values[-1] for t in history.trends()}
    waited = {g for g, n in trends if n == "queue wait"}
    named = {g for g in waited if g.startswith("user ")}
    assert len(named) == 5 and "user" in waited, waited  # five by name, the other three
    assert {g for g in waited if g.startswith("team")} == {f"team t{i}" for i in range(4)}
    assert all(trends[(g, "time to first token")] is not None for g in waited), trends

    def spent(group: str) -> float:
        return (trends[(group, "queue wait")] or 0.0) + (
            trends[(group, "time to first token")] or 0.0
        )

    # Those named waited the most: the others' mean is at most the least of theirs.
    assert min(spent(g) for g in named) >= spent("user") > 0, trends
    page = trends_fragment(history.trends(), history.times)
    assert "<strong>other users</strong> queue wait" in page
    assert "<strong>other teams</strong>" not in page  # four teams: every one by name
