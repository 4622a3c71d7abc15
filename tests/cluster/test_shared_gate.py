"""The shared gate with replicas in this process: one backend queue whatever the replica count.

Two fairq servers share a simulated backend (4 slots) with a tier threshold of 2. Without
``[cluster]`` each opens its own gate and the backend queue grows to about twice the
threshold; with one Redis it stays at the threshold.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc
import pytest

from fairq_bench.redis_process import RedisProcess
from fairq_server.app import FairqServer
from fairq_server.config.cluster import ClusterConfig
from fairq_server.config.schema import Config, TierConfig
from fairq_sim import SimConfig, SimServer
from tests.cluster.credit_helpers import requests_held
from tests.conftest import FairqFactory, make_config, sim_backend
from tests.reliability.helpers import Outcome, gen_request, generate, run_call, until

THRESHOLD = 2
TIERS = (TierConfig("standard", max_backend_waiting=THRESHOLD, tpot_limit_seconds=None),)


@pytest.fixture
async def slow_sim() -> AsyncIterator[SimServer]:
    async with SimServer(SimConfig(mode="vllm", model="sim", speed=5.0, max_num_seqs=4)) as s:
        yield s


def replica_config(sim: SimServer, redis_url: str | None, replica: str) -> Config:
    config = replace(make_config([sim_backend(sim)]), tiers=TIERS)
    if redis_url is None:
        return config
    cluster = ClusterConfig(redis_url, replica_id=replica, lease_seconds=2.0, refresh_seconds=0.05)
    return replace(config, cluster=cluster)


async def flood(
    servers: list[FairqServer], sim: SimServer, per_replica: int
) -> tuple[int, list[Outcome]]:
    """Send ``per_replica`` requests to each server at once; return the backend's waiting peak.

    The peak is the engine's own (its waiting queue after each step's admissions), exact
    where sampling from this loop missed short peaks on a busy machine.
    """
    sim.engine.peak_waiting = 0
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{s.port}") for s in servers]
    try:
        calls = [
            run_call(
                generate(
                    ch,
                    gen_request(f"flood {i} {j}", max_tokens=24),
                    metadata=[("x-fairq-user", f"u{i}")],
                )
            )
            for i, ch in enumerate(channels)
            for j in range(per_replica)
        ]
        outcomes = await asyncio.gather(*calls)
    finally:
        for ch in channels:
            await ch.close()
    return sim.engine.peak_waiting, list(outcomes)


async def test_backend_queue_stays_at_the_threshold_with_two_replicas(
    slow_sim: SimServer, redis_server: RedisProcess, fairq_factory: FairqFactory
) -> None:
    alone = [await fairq_factory(replica_config(slow_sim, None, f"r{i}")) for i in range(2)]
    loose_peak, outcomes = await flood(alone, slow_sim, 12)
    assert all(o.code is grpc.StatusCode.OK for o in outcomes), outcomes
    await until(lambda: slow_sim.engine.num_running == 0, what="backend idle")

    shared = [
        await fairq_factory(replica_config(slow_sim, redis_server.url, f"r{i}")) for i in range(2)
    ]
    tight_peak, outcomes = await flood(shared, slow_sim, 12)
    assert all(o.code is grpc.StatusCode.OK for o in outcomes), outcomes
    # Each replica alone fills the threshold: the queue grows past it. Shared: it holds.
    assert loose_peak > THRESHOLD, loose_peak
    assert tight_peak <= THRESHOLD, (tight_peak, loose_peak)
    # Every slot was given back: nothing held in Redis once all ended but idle credit.
    for server in shared:
        await until(lambda s=server: requests_held(s) == 0, what="slots released")
