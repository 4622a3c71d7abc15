"""Team shares across replicas: two replicas sharing Redis serve teams as one scheduler would.

Team A (weight 2) has a1, a2 and a3 on replica 1; team B (weight 1) has b1 on replica 0.
Both replicas share one backend with few slots, under vtc. Alone, each replica takes about
half of the backend: team B gets about 1/2. Sharing Redis, the team counters are the
cluster's: B gets its 1/3.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import grpc

from fairq_bench.redis_process import RedisProcess
from fairq_server.app import FairqServer
from fairq_server.config.cluster import ClusterConfig
from fairq_server.config.schema import Config, KeyConfig, TierConfig
from fairq_server.config.teams import TeamConfig
from fairq_server.identity.auth import hash_key
from fairq_sim import SimConfig, SimServer
from tests.conftest import FairqFactory, make_config, sim_backend
from tests.reliability.helpers import gen_request, generate, until

from .flood import flood

TIERS = (TierConfig("standard", max_backend_waiting=1, tpot_limit_seconds=None),)
USERS = {"a1": ("A", 1), "a2": ("A", 1), "a3": ("A", 1), "b1": ("B", 0)}
PER_USER = 16
FIRST = 36  # judged on the first requests started, while every user is still backlogged
#: Requests priced mostly by their prompt: a long prompt (counted when dispatched) and two
#: output tokens. VTC charges output when a request ends, so with six output tokens 13 of a
#: request's 15 units came a few turns late, and the first turns drifted by that lag in one
#: process as much as in a cluster (one process alone: a1/a2 gaps 0-8, team B's share
#: 0.33-0.44 over 36 turns). Priced at dispatch, what is left to see is the cluster's sharing.
PAD = "x" * 96
OUTPUT = 2


def config(
    sim: SimServer,
    redis_url: str | None,
    replica: str,
    users: dict[str, tuple[str, int]] = USERS,
    prefix: str = "fairq",
) -> Config:
    keys = [KeyConfig(u, hash_key(f"{u}-key"), team=team) for u, (team, _) in users.items()]
    base = replace(
        make_config([sim_backend(sim)], keys=keys, fairness="vtc"),
        tiers=TIERS,
        teams=(TeamConfig("A", 2.0), TeamConfig("B", 1.0)),
    )
    if redis_url is None:
        return base
    cluster = ClusterConfig(
        redis_url, replica_id=replica, lease_seconds=2.0, refresh_seconds=0.05, key_prefix=prefix
    )
    return replace(base, cluster=cluster)


async def first_tokens(
    sim: SimServer, replicas: list[FairqServer], users: dict[str, tuple[str, int]] = USERS
) -> list[tuple[float, str]]:
    """Flood the replicas, each user its own; return (first-token time, user) of each request
    started once every request was queued (see :func:`~.flood.flood`)."""
    out: list[tuple[float, str]] = []

    async def one(channel: grpc.aio.Channel, user: str, i: int) -> None:
        call = generate(
            channel,
            gen_request(f"{user} {i:02} {PAD}", max_tokens=OUTPUT),
            metadata=[("authorization", f"Bearer {user}-key")],
        )
        async for response in call:
            if response.WhichOneof("event") == "chunk":
                out.append((time.monotonic(), user))
                break
        async for _ in call:  # to the end: a request's charge is settled before the next
            pass

    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{r.port}") for r in replicas]
    try:
        calls = [
            one(channels[replica], user, i)
            for user, (_, replica) in users.items()
            for i in range(PER_USER)
        ]
        held = await flood(sim, replicas, calls)
    finally:
        for channel in channels:
            await channel.close()
    return sorted(out)[held:]


def team_b_share(tokens: list[tuple[float, str]]) -> float:
    first = tokens[:FIRST]
    return sum(1 for _, user in first if USERS[user][0] == "B") / len(first)


async def test_team_shares_hold_across_replicas(
    redis_server: RedisProcess, fairq_factory: FairqFactory
) -> None:
    sim_config = SimConfig(mode="vllm", model="sim", speed=5.0, max_num_seqs=2)
    async with SimServer(sim_config) as sim:
        alone = [await fairq_factory(config(sim, None, r)) for r in "ab"]
        alone_share = team_b_share(await first_tokens(sim, alone))
        await until(lambda: sim.engine.num_running == 0, what="backend idle")
        shared = [await fairq_factory(config(sim, redis_server.url, r)) for r in "ab"]
        shared_share = team_b_share(await first_tokens(sim, shared))
    # One scheduler gives team B 1/3 of the turns; two replicas alone give it about 1/2
    # (0.417 in each of 8 runs here); fairness between users only (no teams) would give b1
    # 1/4. Sharing Redis: 0.306-0.333 in 8 runs, 4 of them beside two busy loops.
    print(f"team B's share: alone {alone_share:.3f}, sharing Redis {shared_share:.3f}")
    assert alone_share >= 0.38, (alone_share, shared_share)
    assert 0.28 <= shared_share <= 0.40, (alone_share, shared_share)


#: Team A's two users on different replicas; the second replica also holds team B's user.
SPLIT = {"a1": ("A", 0), "a2": ("A", 1), "b1": ("B", 1)}


async def test_team_mates_on_different_replicas_share_their_team_evenly(
    redis_server: RedisProcess, fairq_factory: FairqFactory
) -> None:
    """A replica holds a member back while a team mate elsewhere is further behind.

    Team-level heads alone left the members' split to whichever replica reserved the slot
    first: the replica with both a2 and b1 took more of team A's turns for a2.
    """
    # Judged on the median of three floods, each by a fresh pair of replicas (a cluster of
    # its own in Redis): before the flood was held until queued and priced at dispatch, one
    # flood's 36 turns split 10/16 once in a loaded full run (the median of three is what the
    # bounds hold, not one flood's luck; the fault below skews every flood the same way).
    sim_config = SimConfig(mode="vllm", model="sim", speed=5.0, max_num_seqs=2)
    gaps: list[int] = []
    b_shares: list[float] = []
    async with SimServer(sim_config) as sim:
        for n in range(3):
            shared = [
                await fairq_factory(config(sim, redis_server.url, r, SPLIT, f"flood{n}"))
                for r in "ab"
            ]  # fmt: skip
            first = (await first_tokens(sim, shared, SPLIT))[:FIRST]
            for server in shared:
                await server.stop(grace=0.5)
            await until(lambda: sim.engine.num_running == 0, what="backend idle")
            a1, a2 = (sum(1 for _, user in first if user == u) for u in ("a1", "a2"))
            gaps.append(abs(a1 - a2))
            b_shares.append(sum(1 for _, user in first if user == "b1") / len(first))
            print(f"first {FIRST} turns: a1 {a1}, a2 {a2}, team B's share {b_shares[-1]:.3f}")
    # measured 0-3 in one flood (24 floods, 12 beside two busy loops), team B's share
    # 0.306-0.361; team-level heads only: 1-8
    assert statistics.median(gaps) <= 4, gaps
    assert 0.25 <= statistics.median(b_shares) <= 0.42, b_shares
