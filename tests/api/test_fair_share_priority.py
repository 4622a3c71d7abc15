"""Fair-share priority against the simulator's priority mode (``fairq sim --scheduling-policy
priority``): the ordering the real-vLLM test asserts (``tests/e2e/test_fair_share_vllm.py``),
at simulator speed.

A power user floods fairq; once requests of it wait inside the simulated engine, a light user
sends one request. The engine is watched at the moment that request reaches it: with
fair-share priority it starts before every power request then waiting there; without, behind
them (the engine's queue orders one tier's requests by arrival).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import grpc
import pytest

from fairq.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from fairq_server.config.schema import TierConfig
from fairq_sim import SimConfig, SimRequest, SimServer

from ..conftest import KEYS, FairqFactory, make_config, sim_backend

POWER_TOKENS = 300
LIGHT_TOKENS = 7  # tells the light request apart inside the engine


@pytest.fixture
async def priority_sim() -> AsyncIterator[SimServer]:
    """vLLM-mode simulator ordering its queue by ``priority`` (lower first), 4 slots."""
    config = SimConfig(mode="vllm", model="sim", speed=2.0, max_num_seqs=4, priority_mode=True)
    async with SimServer(config) as s:
        yield s


async def _generate(
    stub: scheduler_pb2_grpc.SchedulerStub, user: str, max_tokens: int
) -> list[scheduler_pb2.GenerateResponse]:
    req = scheduler_pb2.GenerateRequest(
        model="sim",
        prompt=f"{user} asks for a long report",
        sampling=scheduler_pb2.SamplingParams(max_tokens=max_tokens),
    )
    return [r async for r in stub.Generate(req, metadata=(("x-fairq-user", user),))]


async def _until(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - polling the engine's state with a deadline
            await asyncio.sleep(0.01)
    assert predicate(), what


@pytest.mark.parametrize(
    ("fair_share", "backend_waiting"),
    [(True, 3), (True, 8), (False, 8)],
    ids=["fair-share", "fair-share-deep-queue", "tier-only-deep-queue"],
)
async def test_light_request_starts_before_power_requests_waiting_in_the_engine(
    priority_sim: SimServer, fairq_factory: FairqFactory, fair_share: bool, backend_waiting: int
) -> None:
    engine = priority_sim.engine
    waiting_then: list[SimRequest] = []
    light: list[SimRequest] = []
    add = engine.add_request

    def watch(request: SimRequest) -> None:  # what waits in the engine when light arrives
        if request.max_tokens == LIGHT_TOKENS:
            waiting_then.extend(engine.waiting)
            light.append(request)
        add(request)

    engine.add_request = watch  # type: ignore[method-assign]
    backend = sim_backend(priority_sim, priority_scheduling=True, fair_share_priority=fair_share)
    tiers = (TierConfig("interactive", max_backend_waiting=backend_waiting),)
    config = replace(make_config([backend]), tiers=tiers)
    server = await fairq_factory(config)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        power = [asyncio.create_task(_generate(stub, "power", POWER_TOKENS)) for _ in range(24)]
        await _until(
            lambda: engine.waiting_count >= backend_waiting - 1, "power requests wait inside"
        )
        events = await _generate(stub, "light", LIGHT_TOKENS)
        for task in power:
            task.cancel()
        await asyncio.gather(*power, return_exceptions=True)
    assert events[-1].finished.usage.completion_tokens == LIGHT_TOKENS
    (request,) = light
    assert request.scheduled_time is not None
    assert waiting_then, "no power request was waiting in the engine"
    started_after = [
        r
        for r in waiting_then
        if r.scheduled_time is None or r.scheduled_time > request.scheduled_time
    ]
    if fair_share:
        assert request.priority < min(r.priority for r in waiting_then)
        assert started_after == waiting_then, "a power request waiting in the engine went first"
    else:
        assert request.priority == waiting_then[0].priority
        assert len(started_after) < len(waiting_then), "FIFO inside a tier: power went first"


async def test_register_backend_sets_fair_share_priority(
    priority_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config(keys=[KEYS["root-key"]]))
    root = (("authorization", "Bearer root-key"),)

    def backend(backend_id: str, **kw: bool) -> admin_pb2.RegisterBackendRequest:
        spec = admin_pb2.Backend(
            id=backend_id, kind=admin_pb2.BACKEND_KIND_VLLM, base_url=priority_sim.url,
            models=["sim"], **kw,
        )  # fmt: skip
        return admin_pb2.RegisterBackendRequest(backend=spec)

    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.RegisterBackend(backend("a", fair_share_priority=True), metadata=root)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "needs priority_scheduling" in (info.value.details() or "")
        reg = await admin.RegisterBackend(
            backend("b", priority_scheduling=True, fair_share_priority=True), metadata=root
        )
        assert reg.status.backend.fair_share_priority
    state = server.core.backend("b")
    assert state is not None and state.backend.fair_share_priority
