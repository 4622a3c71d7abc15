"""The live view's figures: position, waiting time, share against entitlement, over and starved."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from dataclasses import replace

import aiohttp
import grpc

from fairq_server.config.schema import ConsoleConfig, HttpConfig
from fairq_sim import SimServer

from ...conftest import KEYS, FairqFactory, freeze_gate, make_config, sim_backend
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
        # Real clock: a live server's dispatcher ages bob's request past starved_after (0.05 s).
        await asyncio.sleep(0.1)
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
        # Why they wait: no backend admits (the gate sees stale metrics), not fairness.
        assert alice["state"] == bob["state"] == "queued: no backend admits its tier"
        assert (alice["running"], model["running"], model["running_users"]) == (0, 0, 0)
        # The backend row says why nothing is forwarded: the frozen gate sees stale metrics.
        [backend] = view["backends"]
        assert backend["health"] == "stale"
        assert {verdict for _, verdict, _ in backend["gates"]} == {"stale"}
        assert json.dumps(view)  # what a replica publishes to Redis
        for call in calls:
            call.cancel()


async def test_a_user_served_at_once_is_listed_running_with_its_share(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """Before, only users with a request queued were listed: one served at once never was."""
    door = await start_console(fairq_factory, sim)
    sim.config.speed = 0.05  # the request runs while the view is read
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{door.server.port}") as channel,
        aiohttp.ClientSession() as http,
    ):
        sched = stub(channel)
        assert await _drain(sched.Generate(generate(max_tokens=4), metadata=BOB)) == "finished"
        call = sched.Generate(generate(max_tokens=400), metadata=ALICE)
        assert (await call.read()).WhichOneof("event") in ("queued", "started", "token")
        deadline = asyncio.get_running_loop().time() + 60
        while True:  # polled until dispatched: a loaded machine takes its time
            async with http.get(f"{door.url}/console/api/live", headers=ROOT) as resp:
                [view] = (await resp.json())["replicas"]
            [model] = view["models"]
            if model["running"]:
                break
            assert asyncio.get_running_loop().time() < deadline, view
            await asyncio.sleep(0.05)
        call.cancel()
        assert (model["users"], model["running"], model["running_users"]) == (0, 1, 1)
        [alice] = model["rows"]
        assert (alice["user"], alice["tier"], alice["state"]) == ("alice", "batch", "running")
        assert (alice["queued"], alice["running"], alice["position"]) == (0, 1, -1)
        # bob was served a moment ago and contends no more: alice is owed all of it now.
        assert alice["entitled"] == 1.0
        assert alice["share"] == 0.0  # a request's tokens count when it ends (access log)
        async with http.get(f"{door.url}/console/queues", headers=ROOT) as resp:
            page = await resp.text()
        assert '<tr data-user="alice" data-state="running" data-running="1">' in page
        assert "0 queued, 0 users waiting; 1 running, 1 users served" in page


async def test_a_down_backend_shows_no_figures_and_its_reason_in_one_line(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """Before: running 0 and KV 0 % (figures it does not have) and a Python representation."""
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = make_config(
        [replace(sim_backend(sim), base_url=f"http://127.0.0.1:{port}")], keys=list(KEYS.values())
    )
    config = replace(
        config,
        http=HttpConfig(listen="127.0.0.1:0"),
        console=ConsoleConfig(enabled=True, refresh_seconds=0.2),
    )
    server = await fairq_factory(config)
    url = f"http://127.0.0.1:{server.http_port}"
    async with aiohttp.ClientSession(headers=ROOT) as http:
        deadline = asyncio.get_running_loop().time() + 60
        while True:  # polled until the poller gave up on it: a loaded machine takes its time
            async with http.get(f"{url}/console/api/live") as resp:
                [view] = (await resp.json())["replicas"]
            [backend] = view["backends"]
            if backend["health"] == "down":
                break
            assert asyncio.get_running_loop().time() < deadline, backend
            await asyncio.sleep(0.05)
        async with http.get(f"{url}/console/backends") as resp:
            page = await resp.text()
    assert (backend["running"], backend["waiting"], backend["kv_usage"]) == (None, None, None)
    assert backend["error"].lower().endswith("connection refused"), backend["error"]
    assert "(" not in backend["error"] and "\n" not in backend["error"]
    [row] = re.findall(r'<tr data-backend="sim-a".*?</tr>', page)
    cells = re.findall(r"<td>(.*?)</td>", row)
    assert cells[3:6] == ["—", "—", "—"]  # running, waiting, KV cache
    assert '<span class="badge down">down</span>' in cells[2]
    assert "connection refused" in cells[2].lower() and "Error(" not in cells[2]
