"""Shared fairness with replicas in this process: skewed ingress is served as by one scheduler.

A heavy user reaches replica A only; three other users reach replica B. Both share one
backend with few slots. Without shared counters each replica takes slots for its own users,
so the heavy user gets about half of the backend; with them, about a quarter.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import grpc

from fairq_bench.redis_process import RedisProcess
from fairq_server.app import FairqServer
from fairq_server.config.cluster import ClusterConfig
from fairq_server.config.schema import Config, TierConfig
from fairq_sim import SimConfig, SimServer
from tests.conftest import FairqFactory, make_config, sim_backend
from tests.reliability.helpers import gen_request, generate, until

TIERS = (TierConfig("standard", max_backend_waiting=1, tpot_limit_seconds=None),)
PER_USER = 10
FIRST = 24  # judged on the first requests started, while every user is still backlogged


def config(sim: SimServer, redis_url: str | None, replica: str, fairness: str) -> Config:
    base = replace(make_config([sim_backend(sim)], fairness=fairness), tiers=TIERS)
    if redis_url is None:
        return base
    cluster = ClusterConfig(redis_url, replica_id=replica, lease_seconds=2.0, refresh_seconds=0.05)
    return replace(base, cluster=cluster)


async def first_tokens(a: FairqServer, b: FairqServer) -> list[tuple[float, str]]:
    """Flood both replicas; return (first-token time, user) of every request."""
    out: list[tuple[float, str]] = []

    async def one(channel: grpc.aio.Channel, user: str, i: int) -> None:
        call = generate(
            channel, gen_request(f"{user} {i}", max_tokens=16), metadata=[("x-fairq-user", user)]
        )
        async for response in call:
            if response.WhichOneof("event") == "chunk":
                out.append((time.monotonic(), user))
                call.cancel()  # the slot frees at once: a fast, steady turnover
                return

    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{a.port}") as ca,
        grpc.aio.insecure_channel(f"127.0.0.1:{b.port}") as cb,
    ):
        calls = [one(ca, "heavy", i) for i in range(PER_USER * 3)]
        calls += [one(cb, f"light{k}", i) for k in range(3) for i in range(PER_USER)]
        results = await asyncio.gather(*calls, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    return sorted(out)


def heavy_share(tokens: list[tuple[float, str]]) -> float:
    first = tokens[:FIRST]
    return sum(1 for _, user in first if user == "heavy") / len(first)


async def shares_alone(
    sim: SimServer, fairq_factory: FairqFactory, fairness: str
) -> list[float]:  # fmt: skip
    """The heavy user's share by two replicas without Redis, in three floods, each by a fresh
    pair: the skew there is to remove.

    Judged on their median: one flood's share ranged 0.17-0.79 on this machine (two
    replicas alone race for each freed slot, and whichever holds slots tends to keep them:
    mostly 0.5, about one flood in twelve 0.25).
    """
    floods = []
    for _ in range(3):
        a, b = [await fairq_factory(config(sim, None, r, fairness)) for r in "ab"]
        floods.append(heavy_share(await first_tokens(a, b)))
        for server in (a, b):
            await server.stop(grace=0.5)
        await until(lambda: sim.engine.num_running == 0, what="backend idle")
    return floods


async def test_skewed_ingress_round_robin_is_global(
    redis_server: RedisProcess, fairq_factory: FairqFactory
) -> None:
    sim_config = SimConfig(mode="vllm", model="sim", speed=5.0, max_num_seqs=2)
    async with SimServer(sim_config) as sim:
        floods = await shares_alone(sim, fairq_factory, "round-robin")
        a, b = [await fairq_factory(config(sim, redis_server.url, r, "round-robin")) for r in "ab"]
        shared = heavy_share(await first_tokens(a, b))
    # One scheduler would give the heavy user 1/4 of the turns; two alone give it about 1/2
    # (0.54-0.58 alone; 0.375 once in a loaded full run, and floods of 0.50, 0.21, 0.25 in
    # another: two replicas alone race for each slot). The first check only shows the skew
    # is there to remove, in one flood at least; the second is the claim.
    print(f"\n[skewed ingress] heavy share alone {floods}, shared {shared:.3f}")
    assert max(floods) >= shared + 0.1, (floods, shared)
    assert shared <= 0.375, (floods, shared)
