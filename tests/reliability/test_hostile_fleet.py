"""A fleet that goes bad: too many backends, dead ones, a model's only backend killed, and
backends that come and go. What they cost fairq is bounded and nothing waits for ever."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc
import pytest
from prometheus_client import generate_latest

from fairq.v1 import admin_pb2, admin_pb2_grpc
from fairq_bench.hostile_backend import HostileBackend
from fairq_bench.load import ChildProcess, start_sim
from fairq_server.app import FairqServer
from fairq_server.config.schema import AdminConfig, BackendConfig
from fairq_sim import SimConfig, SimServer

from ..conftest import FairqFactory, make_config, sim_backend
from .helpers import Outcome, gen_request, generate, run_call, until

OK, UNAVAILABLE = grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE


def _target(server: FairqServer) -> str:
    return f"127.0.0.1:{server.port}"


def _user(name: str) -> tuple[tuple[str, str], ...]:
    return (("x-fairq-user", name),)


async def _register(server: FairqServer, backend_id: str, url: str, model: str) -> grpc.StatusCode:
    backend = admin_pb2.Backend(
        id=backend_id, kind=admin_pb2.BACKEND_KIND_VLLM, base_url=url, models=[model]
    )
    async with grpc.aio.insecure_channel(_target(server)) as ch:
        try:
            await admin_pb2_grpc.AdminStub(ch).RegisterBackend(
                admin_pb2.RegisterBackendRequest(backend=backend), timeout=10
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return OK


async def _deregister(server: FairqServer, backend_id: str, *, drain: bool = False) -> None:
    async with grpc.aio.insecure_channel(_target(server)) as ch:
        await admin_pb2_grpc.AdminStub(ch).DeregisterBackend(
            admin_pb2.DeregisterBackendRequest(id=backend_id, drain=drain), timeout=10
        )


# -- item 4: a cap on backends, back-off for failing ones ---------------------------------


async def test_registrations_beyond_max_backends_are_resource_exhausted(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(replace(make_config(), admin=AdminConfig(max_backends=3)))
    first = [await _register(server, f"b{i}", sim.url, "sim") for i in range(3)]
    over = await _register(server, "b3", sim.url, "sim")
    again = await _register(server, "b1", sim.url, "sim")  # replacing one is not one more
    await _deregister(server, "b0")
    after = await _register(server, "b3", sim.url, "sim")
    assert first == [OK] * 3
    assert over == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert again == OK and after == OK
    assert sorted(e.backend.id for e in server.core.backends()) == ["b1", "b2", "b3"]


async def test_a_failing_backend_is_polled_ever_less_often_and_recovers(
    fairq_factory: FairqFactory,
) -> None:
    """Every 50 ms while healthy; failing, the interval doubles up to 0.8 s (so a dead
    backend costs a scrape every 0.8 s instead of 20 a second); one good scrape restores it."""
    async with HostileBackend(metrics="nan") as hostile:
        config = make_config(
            [BackendConfig("flaky", "vllm", hostile.url, ("m",))], max_poll_backoff_seconds=0.8
        )
        server = await fairq_factory(config)
        entry = server.core.backend("flaky")
        assert entry is not None
        await until(lambda: hostile.scrapes >= 5, what="five failed scrapes")
        start, counted = time.monotonic(), hostile.scrapes
        await until(lambda: hostile.scrapes >= counted + 3, what="three more")
        per_scrape = (time.monotonic() - start) / 3
        hostile.metrics = "idle"
        await until(lambda: entry.healthy is True, timeout=3, what="healthy again")
        counted, start = hostile.scrapes, time.monotonic()
        await until(lambda: hostile.scrapes >= counted + 10, timeout=3, what="fast again")
        healthy_per_scrape = (time.monotonic() - start) / 10
    assert 0.6 < per_scrape < 1.6, per_scrape  # backed off to the 0.8 s cap
    assert healthy_per_scrape < 0.2, healthy_per_scrape  # back to the 50 ms interval


# -- item 7: a model's only backend dies with work queued ---------------------------------


@pytest.fixture
async def sim_child() -> AsyncIterator[ChildProcess]:
    child = await start_sim("--speed", "0.1", "--max-num-seqs", "8")
    try:
        yield child
    finally:
        await child.stop()


async def _queue_behind_one(
    ch: grpc.aio.Channel, n: int
) -> tuple[grpc.aio.UnaryStreamCall[object, object], list[asyncio.Task[Outcome]]]:
    """One long request on the only slot, then ``n`` queued behind it."""
    running = generate(ch, gen_request(max_tokens=480), metadata=_user("r"), timeout=60)
    out = Outcome()
    while out.chunks == 0:
        response = await running.read()
        kind = response.WhichOneof("event")  # type: ignore[union-attr]
        out.kinds.append(kind)
    queued = []
    for i in range(n):
        call = generate(ch, gen_request(), metadata=_user(f"q{i}"), timeout=60)
        first = await call.read()
        assert first.WhichOneof("event") == "queued"  # type: ignore[union-attr]
        queued.append(asyncio.create_task(run_call(call)))
    return running, queued  # type: ignore[return-value]


async def test_queued_requests_of_a_model_whose_only_backend_died_get_unavailable_after_the_grace(
    sim_child: ChildProcess, fairq_factory: FairqFactory
) -> None:
    """kill -9 of the only backend: the running request fails at once, the queued ones get
    UNAVAILABLE once no backend has been healthy for no_backend_grace_seconds (1 s here),
    not at their 60 s deadline."""
    config = make_config(
        [BackendConfig("only", "vllm", sim_child.address, ("sim",), max_in_flight=1)],
        no_backend_grace_seconds=1.0,
    )
    server = await fairq_factory(config)
    async with grpc.aio.insecure_channel(_target(server)) as ch:
        running, queued = await _queue_behind_one(ch, 3)
        sim_child.kill()
        killed_at = time.monotonic()
        running_out = await run_call(running)  # type: ignore[arg-type]
        outs = await asyncio.gather(*queued)
        waited = time.monotonic() - killed_at
    assert running_out.code == UNAVAILABLE, running_out
    for out in outs:
        assert out.code == UNAVAILABLE, outs
        assert "no healthy backend" in out.details and "1 s" in out.details, out
    assert 1.0 <= waited < 10.0, waited


async def test_a_backend_back_within_the_grace_fails_nobody(
    slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """The only backend unhealthy for less than the grace: queued requests stay queued and
    run when it is back."""
    config = make_config(
        [sim_backend(slow_sim, "only", max_in_flight=1)], no_backend_grace_seconds=30.0
    )
    server = await fairq_factory(config)
    entry = server.core.backend("only")
    assert entry is not None
    async with grpc.aio.insecure_channel(_target(server)) as ch:
        running, queued = await _queue_behind_one(ch, 2)
        slow_sim.config.metrics_fail = True  # scrapes fail: unhealthy, the gate closes
        await until(lambda: entry.healthy is False, what="unhealthy")
        slow_sim.config.metrics_fail = False
        running.cancel()  # type: ignore[attr-defined]
        outs = await asyncio.gather(*queued)
    assert [o.code for o in outs] == [OK, OK], outs


@pytest.fixture
async def slow_sim() -> AsyncIterator[SimServer]:
    async with SimServer(SimConfig(model="sim", speed=1.0, max_num_seqs=4)) as s:
        yield s


# -- items 4 and 11: what a departed backend or model leaves behind -----------------------


def _series(server: FairqServer, label: str) -> list[str]:
    """Sample lines of fairq's /metrics carrying ``label`` (e.g. 'backend="x"')."""
    text = generate_latest(server.core.telemetry.registry).decode()
    return [line for line in text.splitlines() if label in line and not line.startswith("#")]


async def test_deregistering_the_last_backend_drops_its_model_and_every_series(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config([sim_backend(sim, "stays")]))
    async with (
        SimServer(SimConfig(mode="vllm", model="other", speed=20.0)) as other,
        grpc.aio.insecure_channel(_target(server)) as ch,
    ):
        assert await _register(server, "goes", other.url, "other") == OK
        served = await run_call(generate(ch, gen_request(model="other", max_tokens=4)))
        assert served.code == OK, served
        assert _series(server, 'backend="goes"') and _series(server, 'model="other"')
        await _deregister(server, "goes", drain=True)
        gone = await run_call(generate(ch, gen_request(model="other")))
        kept = await run_call(generate(ch, gen_request(max_tokens=4)))
    assert gone.code == grpc.StatusCode.NOT_FOUND, gone
    assert kept.code == OK, kept
    await until(lambda: not _series(server, 'backend="goes"'), what="backend series removed")
    assert not _series(server, 'model="other"')
    assert server.core.dispatcher.model_state("other") is None
    assert _series(server, 'backend="stays"') and _series(server, 'model="sim"')
