"""The console in a cluster: every replica's queues and the backends' shared counts, via Redis."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
import grpc

from fairq.v1 import scheduler_pb2_grpc
from fairq_server.app import FairqServer
from fairq_server.config.schema import ClusterConfig, ConsoleConfig, HttpConfig
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, freeze_gate, make_config, sim_backend
from ..http.console.browser import DOCS, chrome, until
from ..http.console.conftest import generate

ROOT = {"Authorization": "Bearer root-key"}


async def _replica(
    fairq_factory: FairqFactory, sim: SimServer, redis_url: str, name: str
) -> FairqServer:
    config = replace(
        make_config([sim_backend(sim)], keys=list(KEYS.values())),
        http=HttpConfig(listen="127.0.0.1:0"),
        console=ConsoleConfig(enabled=True, refresh_seconds=0.2),
        cluster=ClusterConfig(redis_url, replica_id=name),
    )
    return await fairq_factory(config)


async def _live(url: str) -> list[dict[str, object]]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{url}/console/api/live", headers=ROOT) as resp,
    ):
        assert resp.status == 200
        replicas: list[dict[str, object]] = (await resp.json())["replicas"]
        return replicas


async def test_each_replica_shows_the_whole_cluster(
    redis_url: str, sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    # redis_url first: fixtures are torn down in reverse, so Redis outlives the replicas.
    one = await _replica(fairq_factory, sim, redis_url, "replica-1")
    two = await _replica(fairq_factory, sim, redis_url, "replica-2")
    for server in (one, two):
        await freeze_gate(server)  # requests stay queued where they arrived
    url_one = f"http://127.0.0.1:{one.http_port}"
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{one.port}") as ch1,
        grpc.aio.insecure_channel(f"127.0.0.1:{two.port}") as ch2,
    ):
        alice = (("authorization", "Bearer alice-key"),)
        bob = (("authorization", "Bearer bob-key"),)
        calls = [scheduler_pb2_grpc.SchedulerStub(ch2).Generate(generate(), metadata=alice)]
        calls += [scheduler_pb2_grpc.SchedulerStub(ch1).Generate(generate(), metadata=bob)]
        calls += [scheduler_pb2_grpc.SchedulerStub(ch2).Generate(generate(), metadata=alice)]
        for call in calls:
            assert (await call.read()).WhichOneof("event") == "queued"

        # Replica one's console reads replica two's view from Redis (published every 0.2 s).
        deadline = time.monotonic() + 10
        while True:
            views = await _live(url_one)
            if [v["replica"] for v in views] == ["replica-1", "replica-2"] and _rows(views[1]):
                break
            assert time.monotonic() < deadline, views
            await asyncio.sleep(0.1)  # polling the published views, bounded by the deadline
        assert _rows(views[1]) == [("alice", 2)]
        assert _rows(views[0]) == [("bob", 1)]

        with chrome(tmp_path / "profile") as driver:
            await asyncio.to_thread(_log_in, driver, url_one)
            # The queue view merges both replicas' queues, each row naming its replica.
            text = await asyncio.to_thread(
                until,
                driver,
                lambda d: (
                    "replica-2" in d.find_element("id", "live").text
                    and d.find_element("id", "live").text
                ),
            )
            assert "alice" in str(text) and "bob" in str(text) and "3 queued" in str(text)
            await asyncio.to_thread(driver.get, f"{url_one}/console/cluster")
            text = await asyncio.to_thread(_live_text, driver, "replica-2")
            assert "replica-1 (this one)" in text and "replica-2" in text
            await asyncio.to_thread(driver.save_screenshot, str(DOCS / "cluster.png"))
        for call in calls:
            call.cancel()


def _live_text(driver: object, wanted: str) -> str:
    script = "return document.getElementById('live').innerText"  # one call: no stale element
    text = str(driver.execute_script(script))  # type: ignore[attr-defined]
    return text if wanted in text else ""


def _rows(view: dict[str, object]) -> list[tuple[str, int]]:
    return [(r["user"], r["queued"]) for m in view["models"] for r in m["rows"]]  # type: ignore[attr-defined,index]


def _log_in(driver: object, url: str) -> None:
    from selenium.webdriver.common.keys import Keys

    driver.get(f"{url}/console/login")  # type: ignore[attr-defined]
    field = driver.find_element("id", "key")  # type: ignore[attr-defined]
    field.send_keys("root-key", Keys.ENTER)
