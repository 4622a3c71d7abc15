"""A user who ran alone keeps its share when another joins, with ``[cluster]`` as without.

User A keeps seven requests in flight alone for a while (all of them in the backend: four
running, three in its queue, so A is never queued in fairq), then B joins with eight. In one
process they split evenly from the start: B is lifted to the counter of the last user served.
With ``[cluster]`` (one replica is enough) that lift of a new record never reached Redis, B's
shared counter read back as 0 plus its charges, and A got nothing until B had caught up with
all A had been served alone (issue 33: A 0.02 of the tokens in the first 10 s). Judged on who
is served after B joins, not how fast.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import grpc
import pytest

from fairq_server.config.cluster import ClusterConfig
from fairq_server.config.schema import Config, TierConfig
from fairq_sim import SimServer
from tests.conftest import FairqFactory, make_config, sim_backend
from tests.reliability.helpers import gen_request, generate

TIERS = (TierConfig("standard", max_backend_waiting=3, tpot_limit_seconds=None),)
ALONE = 3.0  # seconds A runs alone
TOGETHER = 1.5  # seconds judged after B joins
A_IN_FLIGHT = 7  # what the backend holds: A is never queued in fairq while alone
B_IN_FLIGHT = 8


def config(sim: SimServer, redis_url: str | None) -> Config:
    base = replace(make_config([sim_backend(sim)], fairness="vtc"), tiers=TIERS)
    if redis_url is None:
        return base
    cluster = ClusterConfig(redis_url, replica_id="r0", lease_seconds=2.0, refresh_seconds=0.05)
    return replace(base, cluster=cluster)


async def closed_loop(
    channel: grpc.aio.Channel, user: str, until: float, done: list[tuple[float, str]]
) -> None:
    i = 0
    while time.monotonic() < until:
        call = generate(
            channel, gen_request(f"{user} {i}", max_tokens=16), metadata=[("x-fairq-user", user)]
        )
        i += 1
        async for response in call:
            if response.WhichOneof("event") == "finished":
                done.append((time.monotonic(), user))


async def share_after_join(server_port: int) -> float:
    done: list[tuple[float, str]] = []
    start = time.monotonic()
    joined = start + ALONE
    until = joined + TOGETHER
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server_port}") as channel:

        async def b_later() -> None:
            await asyncio.sleep(ALONE)  # B's arrival time, not a synchronisation
            await asyncio.gather(
                *(closed_loop(channel, "B", until, done) for _ in range(B_IN_FLIGHT))
            )

        await asyncio.gather(
            *(closed_loop(channel, "A", until, done) for _ in range(A_IN_FLIGHT)), b_later()
        )
    after = [user for t, user in done if joined + 0.2 <= t < until]  # B's first requests ran
    assert after.count("B") > 0 and len(done) > 50
    return after.count("A") / len(after)


@pytest.mark.parametrize("cluster", [False, True], ids=["one process", "cluster"])
async def test_a_user_who_ran_alone_keeps_its_share_when_another_joins(
    sim: SimServer, fairq_factory: FairqFactory, redis_url: str, cluster: bool
) -> None:
    server = await fairq_factory(config(sim, redis_url if cluster else None))
    share = await share_after_join(server.port)
    assert share >= 0.3, share  # fair: about 0.47; before the fix, with [cluster]: 0.00
