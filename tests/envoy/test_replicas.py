"""Three fairq replicas behind one Envoy keep the shared gate (one Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import aiohttp
import pytest

from fairq_bench.envoy_process import EnvoyProcess
from fairq_bench.redis_process import INSTALL_HINT, RedisProcess, redis_server_path
from fairq_server.app import FairqServer
from fairq_server.config.cluster import ClusterConfig
from fairq_server.config.schema import TierConfig
from fairq_sim import SimConfig, SimServer
from tests.cluster.credit_helpers import requests_held
from tests.conftest import FairqFactory, make_config, sim_backend
from tests.reliability.helpers import until

from .conftest import start_envoy, with_extproc

THRESHOLD = 2
TIERS = (TierConfig("standard", max_backend_waiting=THRESHOLD, tpot_limit_seconds=None),)


@pytest.fixture
async def slow_sim() -> AsyncIterator[SimServer]:
    async with SimServer(SimConfig(mode="vllm", model="sim", speed=5.0, max_num_seqs=4)) as s:
        yield s


def completion_tokens(server: FairqServer) -> float:
    return sum(
        s.value
        for metric in server.core.telemetry.registry.collect()
        if metric.name == "fairq_tokens"
        for s in metric.samples
        if s.name == "fairq_tokens_total" and s.labels["kind"] == "completion"
    )


async def test_three_replicas_behind_one_envoy_keep_the_backend_queue_at_the_threshold(
    slow_sim: SimServer, fairq_factory: FairqFactory, envoys: list[EnvoyProcess]
) -> None:
    if redis_server_path() is None:
        pytest.fail(INSTALL_HINT)
    with RedisProcess.running() as redis:
        servers = []
        for i in range(3):
            cluster = ClusterConfig(
                redis.url, replica_id=f"r{i}", lease_seconds=2.0, refresh_seconds=0.05
            )
            config = replace(make_config([sim_backend(slow_sim)]), tiers=TIERS, cluster=cluster)
            servers.append(await fairq_factory(with_extproc(config)))
        envoy = await start_envoy(
            [(f"r{i}", s.config.extproc.listen) for i, s in enumerate(servers)]
        )
        envoys.append(envoy)
        slow_sim.engine.peak_waiting = 0
        body = {"model": "sim", "prompt": "flood", "max_tokens": 24, "stream": True}

        async def one(session: aiohttp.ClientSession, i: int) -> bytes:
            async with session.post(
                envoy.url + "/v1/completions", json={**body, "user": f"u{i % 3}"}
            ) as resp:
                assert resp.status == 200, await resp.text()
                return await resp.read()

        async with aiohttp.ClientSession() as session:
            answers = await asyncio.gather(*(one(session, i) for i in range(36)))
        assert all(a.endswith(b"data: [DONE]\n\n") for a in answers)
        # Every replica decided some of them, and the backend's queue held at the threshold.
        assert all(
            s.core.telemetry.registry.get_sample_value(
                "fairq_requests_total", {"tier": "standard", "outcome": "finished"}
            )
            for s in servers
        )
        assert slow_sim.engine.peak_waiting <= THRESHOLD, slow_sim.engine.peak_waiting
        # Each request's usage reached the replica that dispatched it, once: 36 x 24 tokens.
        await until(lambda: sum(completion_tokens(s) for s in servers) == 36 * 24, what="usage")
        for server in servers:
            await until(lambda s=server: requests_held(s) == 0, what="slots released")
