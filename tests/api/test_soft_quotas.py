"""Soft quotas and budgets: never refused; over them, a user's (or its team's) requests wait in
an idle-only band, served when no in-quota request of their tier waits.

Dispatches are counted in order, one at a time (the backend takes one request at a time), so
the measure is who was served, not how fast.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
import pytest

from fairq.v1 import scheduler_pb2_grpc
from fairq_server.app import FairqServer
from fairq_server.config.entitlement import BudgetConfig, QuotaConfig
from fairq_server.config.prices import PriceConfig
from fairq_server.config.schema import Config, KeyConfig
from fairq_server.config.teams import TeamConfig
from fairq_server.identity.auth import hash_key
from fairq_sim import SimServer

from ..conftest import FairqFactory, freeze_gate, make_config, sim_backend
from .test_quotas import Clock, entitlement, gen

KEYS = [
    KeyConfig("ann", hash_key("ann-key"), team="research"),
    KeyConfig("cy", hash_key("cy-key"), team="research"),
    KeyConfig("bob", hash_key("bob-key")),
]
PRICES = {"sim": PriceConfig(input_per_million=1000.0, output_per_million=1000.0)}

CASES = {
    "user quota": {"quotas": (QuotaConfig(user="ann", tokens_per_minute=5, mode="soft"),)},
    "team quota": {"quotas": (QuotaConfig(team="research", tokens_per_minute=5, mode="soft"),)},
    "user budget": {
        "prices": PRICES,
        "budgets": (BudgetConfig(user="ann", per_day=0.001, mode="soft"),),
    },
}


async def start(sim: SimServer, fairq_factory: FairqFactory, limits: dict[str, object]) -> tuple[
    FairqServer, Config
]:  # fmt: skip
    backend = sim_backend(sim, max_in_flight=1)
    config = replace(
        make_config([backend], keys=KEYS, fairness="vtc"),
        teams=(TeamConfig("research"),),
        **limits,  # type: ignore[arg-type]
    )
    server = await fairq_factory(config)
    entitlement(server).clock = Clock()
    return server, config


async def run(server: FairqServer, config: Config, users: list[str]) -> list[str]:
    """Queue one request per entry of ``users`` behind a shut gate, open it; return who started
    in which order, after every request finished without an error."""
    await freeze_gate(server)
    order: list[str] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        calls = []
        for user in users:
            md = (("authorization", f"Bearer {user}-key"),)
            call = stub.Generate(gen(max_tokens=4), metadata=md, timeout=60)
            assert (await call.read()).WhichOneof("event") == "queued"
            calls.append((user, call))

        async def follow(user: str, call: grpc.aio.UnaryStreamCall) -> str:  # type: ignore[type-arg]
            last = ""
            while (event := await call.read()) is not grpc.aio.EOF:
                last = event.WhichOneof("event")
                if last == "started":
                    order.append(user)
            return last

        tasks = [asyncio.create_task(follow(u, c)) for u, c in calls]
        await server.core.register_backend(config.backends[0])  # the gate opens
        assert await asyncio.gather(*tasks) == ["finished"] * len(users)
    return order


async def over(server: FairqServer, user: str = "ann") -> None:
    """Send one request as ``user``: its use passes the soft limit (nothing is refused)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        md = (("authorization", f"Bearer {user}-key"),)
        events = [e async for e in stub.Generate(gen(max_tokens=4), metadata=md)]
    assert events[-1].WhichOneof("event") == "finished"
    assert entitlement(server).demoted(user, "research", "sim")


@pytest.mark.parametrize("case", sorted(CASES))
async def test_over_a_soft_limit_alone_is_served_in_full(
    sim: SimServer, fairq_factory: FairqFactory, case: str
) -> None:
    server, config = await start(sim, fairq_factory, CASES[case])
    await over(server)
    assert await run(server, config, ["ann"] * 6) == ["ann"] * 6
    registry = server.core.telemetry.registry
    assert registry.get_sample_value("fairq_soft_band_dispatches_total") == 6.0
    assert registry.get_sample_value("fairq_soft_band_demotions_total") == 0.0


@pytest.mark.parametrize("case", sorted(CASES))
async def test_over_a_soft_limit_waits_behind_in_quota_work(
    sim: SimServer, fairq_factory: FairqFactory, case: str
) -> None:
    server, config = await start(sim, fairq_factory, CASES[case])
    await over(server)
    # ann queues first; with equal shares fairness would alternate ann and bob.
    order = await run(server, config, ["ann"] * 5 + ["bob"] * 5)
    assert order == ["bob"] * 5 + ["ann"] * 5
    registry = server.core.telemetry.registry
    assert registry.get_sample_value("fairq_soft_band_demotions_total") == 5.0


async def test_a_team_over_its_soft_quota_puts_all_its_users_in_the_band(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server, config = await start(sim, fairq_factory, CASES["team quota"])
    await over(server, "ann")
    assert entitlement(server).demoted("cy", "research", "sim")  # cy has sent nothing
    order = await run(server, config, ["cy", "cy", "bob", "bob", "cy"])
    assert order == ["bob", "bob", "cy", "cy", "cy"]


async def test_without_a_soft_limit_the_same_queue_alternates(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """The control: what the band changes (fails if the band held everyone back)."""
    server, config = await start(sim, fairq_factory, {})
    order = await run(server, config, ["ann"] * 3 + ["bob"] * 3)
    assert order[:2] in (["ann", "bob"], ["bob", "ann"])
    assert sorted(order) == ["ann"] * 3 + ["bob"] * 3
