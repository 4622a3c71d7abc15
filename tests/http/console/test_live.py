"""The live view's figures: position, waiting time, share against entitlement, over and starved."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import grpc

from fairq_sim import SimServer

from ...conftest import FairqFactory, freeze_gate
from .conftest import generate, start_console, stub

ALICE = (("authorization", "Bearer alice-key"),)
BOB = (("authorization", "Bearer bob-key"),)
ROOT = {"Authorization": "Bearer root-key"}


async def _drain(call: grpc.aio.UnaryStreamCall) -> str:  # type: ignore[type-arg]
    last = ""
    async for event in call:
        last = event.WhichOneof("event")
    return last


async def test_queue_rows_mark_the_user_over_and_the_starved_one(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    door = await start_console(fairq_factory, sim, starved_after_seconds=0.05)
    server = door.server
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        sched = stub(channel)
        # Alice is served alone first: all the recent service is hers.
        assert await _drain(sched.Generate(generate(), metadata=ALICE)) == "finished"
        await freeze_gate(server)
        calls = [sched.Generate(generate("sim", "standard"), metadata=BOB)]
        calls += [sched.Generate(generate(), metadata=ALICE) for _ in range(3)]
        for call in calls:
            assert (await call.read()).WhichOneof("event") == "queued"
        await asyncio.sleep(0.1)  # bob's request waits past starved_after (0.05 s)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{door.url}/console/api/live", headers=ROOT) as resp,
        ):
            assert resp.status == 200
            [view] = (await resp.json())["replicas"]
        [model] = view["models"]
        assert model["tiers"] == [["interactive", 0], ["standard", 1], ["batch", 3]]
        assert model["users"] == 2
        rows = {r["user"]: r for r in model["rows"]}
        bob, alice = rows["bob"], rows["alice"]
        # Bob's standard request goes before alice's batch ones.
        assert (bob["tier"], bob["position"], bob["queued"]) == ("standard", 0, 1)
        assert (alice["tier"], alice["position"], alice["queued"]) == ("batch", 1, 3)
        assert bob["waiting_seconds"] >= 0.05
        assert alice["entitled"] == bob["entitled"] == 0.5
        assert (alice["share"], bob["share"]) == (1.0, 0.0)
        assert (alice["status"], bob["status"]) == ("over", "starved")
        # The backend row says why nothing is forwarded: the frozen gate sees stale metrics.
        [backend] = view["backends"]
        assert backend["health"] == "stale"
        assert {verdict for _, verdict, _ in backend["gates"]} == {"stale"}
        assert json.dumps(view)  # what a replica publishes to Redis
        for call in calls:
            call.cancel()
