"""Scheduler/Generate on an in-process grpc.aio server against the simulated backend."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
import pytest

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, freeze_gate, make_config, sim_backend


def request(**kw: object) -> scheduler_pb2.GenerateRequest:
    kw.setdefault("model", "sim")
    if "prompt" not in kw and "messages" not in kw:
        kw["prompt"] = "Hello there"
    sampling = kw.pop("sampling", scheduler_pb2.SamplingParams(max_tokens=8))
    return scheduler_pb2.GenerateRequest(sampling=sampling, **kw)  # type: ignore[arg-type]


async def call(
    port: int, req: scheduler_pb2.GenerateRequest, metadata: tuple[tuple[str, str], ...] = ()
) -> list[scheduler_pb2.GenerateResponse]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        return [r async for r in stub.Generate(req, metadata=metadata)]


async def test_stream_events_in_order(sim: SimServer, fairq_factory: FairqFactory) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)]))
    events = await call(server.port, request(), (("x-fairq-user", "carol"),))
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "queued"
    assert kinds[1] == "started"
    assert kinds[-1] == "finished"
    assert set(kinds[2:-1]) == {"chunk"}
    started, finished = events[1].started, events[-1].finished
    assert started.backend_id == "sim-a"
    assert started.tier == "interactive"
    assert finished.usage.completion_tokens == 8
    assert finished.usage.prompt_tokens > 0
    assert finished.finish_reason == "length"
    text = "".join(e.chunk.text for e in events if e.WhichOneof("event") == "chunk")
    assert text
    t = finished.timings
    assert 0 <= t.queue_seconds <= t.ttft_seconds <= t.total_seconds


async def test_chat_messages(sim: SimServer, fairq_factory: FairqFactory) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)]))
    msgs = scheduler_pb2.ChatMessages(
        messages=[scheduler_pb2.ChatMessage(role="user", content="What is fair?")]
    )
    events = await call(server.port, request(messages=msgs))
    assert events[-1].finished.usage.completion_tokens == 8


@pytest.mark.parametrize(
    ("req", "metadata", "code", "needle"),
    [
        (request(model=""), (), grpc.StatusCode.INVALID_ARGUMENT, "model is required"),
        (request(model="gpt-9"), (), grpc.StatusCode.NOT_FOUND, "model 'gpt-9' is not served"),
        (request(prompt="   "), (), grpc.StatusCode.INVALID_ARGUMENT, "prompt is empty"),
        (
            scheduler_pb2.GenerateRequest(model="sim"),
            (),
            grpc.StatusCode.INVALID_ARGUMENT,
            "one of prompt, messages or prompt_token_ids is required",
        ),
        (
            request(messages=scheduler_pb2.ChatMessages()),
            (),
            grpc.StatusCode.INVALID_ARGUMENT,
            "messages is empty",
        ),
        (
            request(sampling=scheduler_pb2.SamplingParams(max_tokens=0)),
            (),
            grpc.StatusCode.INVALID_ARGUMENT,
            "max_tokens must be between 1",
        ),
        (
            request(sampling=scheduler_pb2.SamplingParams(temperature=3.0)),
            (),
            grpc.StatusCode.INVALID_ARGUMENT,
            "temperature must be in [0, 2]",
        ),
        (
            request(sampling=scheduler_pb2.SamplingParams(top_p=0.0)),
            (),
            grpc.StatusCode.INVALID_ARGUMENT,
            "top_p must be in (0, 1]",
        ),
        (
            request(sampling=scheduler_pb2.SamplingParams(stop=["a", "b", "c", "d", "e"])),
            (),
            grpc.StatusCode.INVALID_ARGUMENT,
            "sampling.stop has 5 strings",
        ),
        (request(tier="platinum"), (), grpc.StatusCode.INVALID_ARGUMENT, "unknown tier 'platinum'"),
    ],
)
async def test_bad_input_gets_a_clear_status(
    sim: SimServer,
    fairq_factory: FairqFactory,
    req: scheduler_pb2.GenerateRequest,
    metadata: tuple[tuple[str, str], ...],
    code: grpc.StatusCode,
    needle: str,
) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)]))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(server.port, req, metadata)
    assert info.value.code() == code
    assert needle in (info.value.details() or "")
    # Nothing else is disturbed: the next good request is served.
    events = await call(server.port, request())
    assert events[-1].WhichOneof("event") == "finished"


@pytest.mark.parametrize(
    ("metadata", "tier", "code", "needle"),
    [
        ((), "", grpc.StatusCode.UNAUTHENTICATED, "missing 'authorization"),
        (
            (("authorization", "Bearer nope"),),
            "",
            grpc.StatusCode.UNAUTHENTICATED,
            "invalid API key",
        ),
        ((("authorization", "Basic alice-key"),), "", grpc.StatusCode.UNAUTHENTICATED, "Bearer"),
        (
            (("authorization", "Bearer alice-key"),),
            "interactive",
            grpc.StatusCode.PERMISSION_DENIED,
            "above the ceiling 'standard'",
        ),
    ],
)
async def test_identity_errors(
    sim: SimServer,
    fairq_factory: FairqFactory,
    metadata: tuple[tuple[str, str], ...],
    tier: str,
    code: grpc.StatusCode,
    needle: str,
) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)], keys=list(KEYS.values())))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(server.port, request(tier=tier), metadata)
    assert info.value.code() == code
    assert needle in (info.value.details() or "")


async def test_key_ceiling_and_lower_tiers(sim: SimServer, fairq_factory: FairqFactory) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)], keys=list(KEYS.values())))
    alice = (("authorization", "Bearer alice-key"),)
    default = await call(server.port, request(), alice)
    assert default[1].started.tier == "standard"  # the key's ceiling
    lower = await call(server.port, request(tier="batch"), alice)
    assert lower[1].started.tier == "batch"


async def test_queue_cap_is_resource_exhausted(sim: SimServer, fairq_factory: FairqFactory) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)], max_queued_per_user=2))
    dispatcher = server.core.dispatcher.model_state("sim")
    await freeze_gate(server)
    md = (("x-fairq-user", "dave"),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        calls = [stub.Generate(request(), metadata=md) for _ in range(2)]
        for c in calls:  # each is queued
            first = await c.read()
            assert first.WhichOneof("event") == "queued"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(server.port, request(), md)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "already has 2 queued requests" in (info.value.details() or "")
        # Another user is not affected by dave's cap.
        other = stub.Generate(request(), metadata=(("x-fairq-user", "erin"),))
        assert (await other.read()).WhichOneof("event") == "queued"
        for c in (*calls, other):
            c.cancel()
    # Cancelled queued requests leave the queue.
    await _until(lambda: len(dispatcher.queue) == 0)


async def test_queue_caps_count_every_model(sim: SimServer, fairq_factory: FairqFactory) -> None:
    # One backend serving three models: a cap per model let one user hold 9 requests here.
    backend = sim_backend(sim, verify_models=False)
    backend = replace(backend, models=("sim", "m2", "m3"))
    config = make_config([backend], max_queued_per_user=3, max_queued_total=5)
    server = await fairq_factory(config)
    await freeze_gate(server)
    dave, erin = (("x-fairq-user", "dave"),), (("x-fairq-user", "erin"),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        held = []

        async def queue(*calls: tuple[str, tuple[tuple[str, str], ...]]) -> None:
            for model, md in calls:
                held.append(stub.Generate(request(model=model), metadata=md))
                assert (await held[-1].read()).WhichOneof("event") == "queued"

        async def refused(model: str, md: tuple[tuple[str, str], ...], needle: str) -> None:
            attempt = stub.Generate(request(model=model), metadata=md)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await attempt.read()  # "queued" without the caps
                attempt.cancel()
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert needle in (info.value.details() or "")

        await queue(("sim", dave), ("m2", dave), ("m3", dave))
        await refused("m3", dave, "user 'dave' already has 3 queued requests")
        await queue(("m2", erin), ("m3", erin))
        await refused("sim", (("x-fairq-user", "fay"),), "queues are full (5 requests queued")
        for c in held:
            c.cancel()


async def test_no_healthy_backend_is_unavailable(fairq_factory: FairqFactory) -> None:
    from fairq_server.config.schema import BackendConfig

    dead = BackendConfig("dead", "vllm", "http://127.0.0.1:9", ("sim",))
    server = await fairq_factory(make_config([dead]))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(server.port, request())
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no healthy backend" in (info.value.details() or "")


async def test_cancel_mid_stream_aborts_backend_request(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    sim.config.speed = 0.2  # slow enough that the stream is still running when we cancel
    server = await fairq_factory(make_config([sim_backend(sim)]))
    entry = server.core.backend("sim-a")
    assert entry is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        call_ = stub.Generate(request(sampling=scheduler_pb2.SamplingParams(max_tokens=400)))
        async for event in call_:
            if event.WhichOneof("event") == "chunk":
                break
        assert sim.engine.running_count == 1
        call_.cancel()
    async with asyncio.timeout(5):
        await entry.idle.wait()  # the dispatcher released the backend slot
    await _until(lambda: sim.engine.running_count == 0)
    assert entry.in_flight == 0
    assert entry.awaiting_first_token == 0


async def _until(predicate: object, timeout: float = 5.0) -> None:
    """Wait for a condition in another server's state that has no event to await."""
    async with asyncio.timeout(timeout):
        # Polling foreign state with a deadline: there is no event to await.
        while not predicate():  # type: ignore[operator]  # noqa: ASYNC110
            await asyncio.sleep(0.01)
