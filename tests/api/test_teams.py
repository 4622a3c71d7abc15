"""Teams end to end: a key's team reaches the scheduler and the per-team token counter."""

from __future__ import annotations

from dataclasses import replace

import grpc

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_server.config.schema import KeyConfig
from fairq_server.config.teams import TeamConfig
from fairq_server.identity.auth import hash_key
from fairq_sim import SimServer

from ..conftest import FairqFactory, freeze_gate, make_config, sim_backend


async def test_requests_count_under_their_keys_team(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    keys = [
        KeyConfig("ann", hash_key("ann-key"), team="research"),
        KeyConfig("bo", hash_key("bo-key"), team="none"),  # named like the no-team label
        KeyConfig("cy", hash_key("cy-key")),
    ]
    config = replace(
        make_config([sim_backend(sim)], keys=keys, fairness="vtc"),
        teams=(TeamConfig("research", 2.0), TeamConfig("none")),
    )
    server = await fairq_factory(config)
    req = scheduler_pb2.GenerateRequest(
        model="sim", prompt="hello", sampling=scheduler_pb2.SamplingParams(max_tokens=3)
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        for key in ("ann-key", "bo-key", "cy-key", "ann-key"):
            [e async for e in stub.Generate(req, metadata=(("authorization", f"Bearer {key}"),))]
    registry = server.core.telemetry.registry

    def completion(team: str) -> float | None:
        return registry.get_sample_value(
            "fairq_team_tokens_total", {"team": team, "kind": "completion"}
        )

    assert completion("research") == 6.0
    assert completion("team:none") == 3.0  # a team named "none" is not the teamless users
    assert completion("none") == 3.0


async def test_a_reload_gives_the_next_requests_the_new_team_weight(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    keys = [KeyConfig("ann", hash_key("ann-key"), team="research")]
    config = replace(
        make_config([sim_backend(sim)], keys=keys, fairness="vtc"),
        teams=(TeamConfig("research", 2.0),),
    )
    server = await fairq_factory(config)
    await freeze_gate(server)  # requests stay queued
    req = scheduler_pb2.GenerateRequest(
        model="sim", prompt="hello", sampling=scheduler_pb2.SamplingParams(max_tokens=3)
    )
    metadata = (("authorization", "Bearer ann-key"),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        first = stub.Generate(req, metadata=metadata, timeout=20)
        assert (await first.read()).WhichOneof("event") == "queued"
        await server.reload(replace(config, teams=(TeamConfig("research", 5.0),)))
        second = stub.Generate(req, metadata=metadata, timeout=20)
        assert (await second.read()).WhichOneof("event") == "queued"
        queued = [
            ticket
            for tier in server.core.dispatcher.queue("sim").tiers
            for _, _, ticket in tier._flows.get("ann", _NO_FLOW).heap
        ]
        assert sorted((t.team, t.team_weight) for t in queued) == [
            ("research", 2.0),
            ("research", 5.0),
        ]
        first.cancel()
        second.cancel()


class _NoFlow:
    heap: tuple[()] = ()


_NO_FLOW = _NoFlow()
