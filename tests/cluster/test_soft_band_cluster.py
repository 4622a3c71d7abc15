"""The soft quota's idle-only band across replicas: in-quota work waiting on another replica
keeps an over-quota user's requests back here too (the other replica takes the slot)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
import pytest

from fairq.v1 import scheduler_pb2_grpc
from fairq_server.app import FairqServer
from fairq_server.config.cluster import ClusterConfig
from fairq_server.config.entitlement import QuotaConfig
from fairq_server.config.schema import KeyConfig
from fairq_server.config.teams import TeamConfig
from fairq_server.identity.auth import hash_key
from fairq_sim import SimServer
from tests.conftest import FairqFactory, freeze_gate, make_config, sim_backend
from tests.reliability.helpers import gen_request, until


def _heads(server: FairqServer) -> set[str]:
    tier = server.core.dispatcher._models["sim"].queue.tiers[0]
    return {name for name, _ in tier.counters.peer_heads.pairs}


KEYS = [
    KeyConfig("ann", hash_key("ann-key"), team="research"),
    KeyConfig("bob", hash_key("bob-key")),
]
QUOTAS = {
    "user": QuotaConfig(user="ann", tokens_per_day=5, mode="soft"),
    "team": QuotaConfig(team="research", tokens_per_day=5, mode="soft"),  # a team-level head
}


@pytest.mark.parametrize("over", sorted(QUOTAS))
async def test_the_band_waits_for_in_quota_work_on_another_replica(
    redis_url: str, sim: SimServer, fairq_factory: FairqFactory, over: str
) -> None:
    # redis_url first: fixtures are torn down in reverse, so Redis outlives the replicas.
    replicas = []
    for name in ("r0", "r1"):
        config = replace(
            make_config([sim_backend(sim, max_in_flight=1)], keys=KEYS, fairness="vtc"),
            teams=(TeamConfig("research"),),
            quotas=(QUOTAS[over],),
            cluster=ClusterConfig(redis_url, replica_id=name, lease_seconds=2.0),
        )
        replicas.append(await fairq_factory(config))
    here, there = replicas
    ann, bob = (("authorization", "Bearer ann-key"),), (("authorization", "Bearer bob-key"),)
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{here.port}") as ch0,
        grpc.aio.insecure_channel(f"127.0.0.1:{there.port}") as ch1,
    ):
        stubs = scheduler_pb2_grpc.SchedulerStub(ch0), scheduler_pb2_grpc.SchedulerStub(ch1)
        done = [e async for e in stubs[0].Generate(gen_request(max_tokens=4), metadata=ann)]
        assert done[-1].WhichOneof("event") == "finished"  # ann is past her soft quota now
        entitlement = here.core.dispatcher.entitlement
        assert entitlement is not None and entitlement.demoted("ann", "research", "sim")

        for server in replicas:
            await freeze_gate(server)
        order: list[str] = []
        calls: list[tuple[str, grpc.aio.UnaryStreamCall]] = []  # type: ignore[type-arg]
        for user, stub, md in [("ann", stubs[0], ann)] * 4 + [("bob", stubs[1], bob)] * 4:
            call = stub.Generate(gen_request(max_tokens=4), metadata=md, timeout=60)
            assert (await call.read()).WhichOneof("event") == "queued"
            calls.append((user, call))
        # Replica r0 has read r1's heads: bob waits there, in quota.
        await until(lambda: "bob" in _heads(here), timeout=10)

        async def follow(user: str, call: grpc.aio.UnaryStreamCall) -> str:  # type: ignore[type-arg]
            last, started = "", False
            while (event := await call.read()) is not grpc.aio.EOF:
                last = event.WhichOneof("event")
                if last == "started" and not started:  # a refused reservation starts again
                    started = True
                    order.append(user)
            return last

        tasks = [asyncio.create_task(follow(u, c)) for u, c in calls]
        for server in replicas:  # the gates open
            await server.core.register_backend(server.config.backends[0])
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert results == ["finished"] * 8, (order, _heads(here))
    # One request at a time over both replicas: bob's all went first, then ann's band.
    assert order == ["bob"] * 4 + ["ann"] * 4
