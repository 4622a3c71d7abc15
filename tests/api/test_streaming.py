"""The backend edge reports its own lifecycle: a slot is free when the backend is done.

The client channel turns off gRPC's window auto-tuning and asks for a 1 KiB stream window, so a
client that does not read stops fairq's writes early; a 3,000-token generation (~13 KB of
text) outgrows that many times over.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_server.backends.vllm import VllmBackend
from fairq_server.config.schema import RequestBounds
from fairq_sim import SimConfig, SimServer

from ..conftest import FairqFactory, make_config, sim_backend

LONG = 3_000
WINDOW = 1024
NO_AUTOTUNE = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", WINDOW)]


@pytest.fixture
async def long_sim() -> AsyncIterator[SimServer]:
    config = SimConfig(mode="vllm", model="sim", speed=20.0, max_num_seqs=4, max_model_len=4_000)
    async with SimServer(config) as s:
        yield s


def long_request() -> scheduler_pb2.GenerateRequest:
    sampling = scheduler_pb2.SamplingParams(max_tokens=LONG)
    return scheduler_pb2.GenerateRequest(model="sim", prompt="Tell a long story", sampling=sampling)


async def until(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Wait for state with no event to await (another server's, or the dispatcher's)."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - polling foreign state with a deadline
            await asyncio.sleep(0.02)
    assert predicate(), what


async def test_the_backend_slot_frees_when_the_backend_finishes_not_when_the_client_reads(
    long_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config([sim_backend(long_sim)]))
    state = server.core.backend("sim-a")
    assert state is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}", options=NO_AUTOTUNE) as ch:
        call = scheduler_pb2_grpc.SchedulerStub(ch).Generate(long_request())
        first = [await call.read() for _ in range(3)]
        assert [e.WhichOneof("event") for e in first] == ["queued", "started", "chunk"]
        # The client reads nothing more; the backend runs to the end all the same.
        await until(lambda: state.in_flight == 0, "backend slot freed")
        assert state.finished == 1 and long_sim.engine.running_count == 0
        rest = []
        while (event := await call.read()) is not grpc.aio.EOF:
            rest.append(event)
    assert rest[-1].WhichOneof("event") == "finished"
    assert rest[-1].finished.usage.completion_tokens == LONG
    text = "".join(e.chunk.text for e in [*first, *rest] if e.WhichOneof("event") == "chunk")
    assert len(text) > 10 * WINDOW  # far more than the transport could have taken unread


async def test_a_client_that_stops_reading_is_cut_off_at_the_limit(
    long_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    config = make_config([sim_backend(long_sim)])
    server = await fairq_factory(replace(config, limits=RequestBounds(max_unread_chars=2_000)))
    state = server.core.backend("sim-a")
    assert state is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}", options=NO_AUTOTUNE) as ch:
        call = scheduler_pb2_grpc.SchedulerStub(ch).Generate(long_request())
        assert (await call.read()).WhichOneof("event") == "queued"
        await until(lambda: state.in_flight == 0, "backend request aborted")
        await until(lambda: long_sim.engine.running_count == 0, "backend stopped generating")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            while await call.read() is not grpc.aio.EOF:
                pass
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "characters of text unread" in (info.value.details() or "")
    # Others are served as usual afterwards.
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        short = scheduler_pb2.GenerateRequest(
            model="sim", prompt="hi", sampling=scheduler_pb2.SamplingParams(max_tokens=4)
        )
        events = [e async for e in scheduler_pb2_grpc.SchedulerStub(ch).Generate(short)]
    assert events[-1].finished.usage.completion_tokens == 4


class _CrashingScrapes(VllmBackend):
    """A vLLM adapter whose second scrape raises what no adapter should (a fairq bug)."""

    scrapes = 0

    async def scrape(self, timeout: float) -> object:  # type: ignore[override]
        type(self).scrapes += 1
        if type(self).scrapes == 2:
            raise RuntimeError("injected poller fault")
        return await super().scrape(timeout)


async def test_a_crashed_poller_reports_a_failed_scrape_and_restarts(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config([]))
    backend = _CrashingScrapes("sim-a", sim.url, ["sim"])
    state = await server.core.register_backend(sim_backend(sim), backend=backend)
    await until(lambda: state.failures == 1, "the crash counted as a failed scrape", 10)
    assert "injected poller fault" in state.last_error
    await until(lambda: state.scrapes >= 3, "polling resumed", 10)
    assert state.healthy is True


async def test_health_is_not_serving_while_the_dispatcher_loop_restarts(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)]))
    dispatcher = server.core.dispatcher
    await dispatcher.sync()
    # Restart the loop with a long first delay, then crash it once.
    assert dispatcher._task is not None
    dispatcher._task.cancel()
    dispatcher.restart_delays = (1.0,)
    dispatcher.start()
    real = dispatcher._picker.dispatch
    faults = iter([RuntimeError("injected dispatcher fault")])

    def faulty(now: float, batch: int) -> bool:
        for fault in faults:
            raise fault
        return real(now, batch)

    dispatcher._picker.dispatch = faulty  # type: ignore[method-assign]
    service = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        health = health_pb2_grpc.HealthStub(ch)

        async def status() -> int:
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
            return int(reply.status)

        dispatcher.wake()
        # Real clock: a live server's dispatcher is down for its 1 s restart delay.
        async with asyncio.timeout(5):
            while await status() != health_pb2.HealthCheckResponse.NOT_SERVING:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        assert dispatcher.crashes == 1
        async with asyncio.timeout(5):
            while await status() != health_pb2.HealthCheckResponse.SERVING:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        short = scheduler_pb2.GenerateRequest(
            model="sim", prompt="hi", sampling=scheduler_pb2.SamplingParams(max_tokens=4)
        )
        events = [e async for e in scheduler_pb2_grpc.SchedulerStub(ch).Generate(short)]
    assert events[-1].finished.usage.completion_tokens == 4
