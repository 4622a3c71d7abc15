"""fairq's own /metrics endpoint, scraped over HTTP and parsed like Prometheus would."""

from __future__ import annotations

import asyncio
import gc
from dataclasses import replace

import grpc
import httpx
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_server.app import FairqServer
from fairq_server.backends.vllm import VllmBackend
from fairq_server.config.schema import BackendConfig
from fairq_sim import SimServer

from ..conftest import FairqFactory, make_config, sim_backend
from ..scripted_http import hang_up, reply, serve

IDLE_VLLM = (
    "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"
    "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
)


async def test_metrics_endpoint_reports_requests_dispatches_and_backend_state(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    config = replace(make_config([sim_backend(sim)]), metrics_listen="127.0.0.1:0")
    server = await fairq_factory(config)
    assert server.metrics_port > 0
    req = scheduler_pb2.GenerateRequest(
        model="sim", prompt="hi", sampling=scheduler_pb2.SamplingParams(max_tokens=3)
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        for user in ("a", "b"):
            [e async for e in stub.Generate(req, metadata=(("x-fairq-user", user),))]
    gc.collect(1)  # a young pass: reported within the collector's one-second check
    async with httpx.AsyncClient() as http, asyncio.timeout(10):
        while True:
            text = (await http.get(f"http://127.0.0.1:{server.metrics_port}/metrics")).text
            samples = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
            }
            if samples.get(("fairq_gc_pause_seconds_count", (("generation", "1"),))):
                break
            await asyncio.sleep(0.1)
    # The full pass at start-up, before the heap was frozen.
    assert samples[("fairq_gc_pause_seconds_count", (("generation", "2"),))] >= 1
    assert (
        samples[("fairq_requests_total", (("outcome", "finished"), ("tier", "interactive")))] == 2
    )
    assert samples[("fairq_dispatches_total", (("backend", "sim-a"), ("tier", "interactive")))] == 2
    assert samples[("fairq_tokens_total", (("group", "default"), ("kind", "completion")))] == 6
    assert samples[("fairq_backend_healthy", (("backend", "sim-a"),))] == 1
    assert samples[("fairq_backend_in_flight", (("backend", "sim-a"),))] == 0
    assert ("fairq_queue_depth", (("model", "sim"), ("tier", "batch"))) in samples
    # No label carries a user name or a request id.
    assert not any(v in ("a", "b") for _, labels in samples for _, v in labels)


def _sample(server: FairqServer, name: str) -> float:
    value = server.core.telemetry.registry.get_sample_value(name, {"backend": "flaky"})
    return value if value is not None else 0.0  # a counter never incremented has no sample


@pytest.mark.parametrize(("threshold", "gauge_after_failure"), [(2, 1.0), (1, 0.0)])
async def test_a_single_failed_scrape_is_counted_and_marks_unhealthy_only_at_the_threshold(
    fairq_factory: FairqFactory, threshold: int, gauge_after_failure: float
) -> None:
    """scheduler.unhealthy_after_failures end to end: the backend hangs up on its second
    scrape, the rest answer. Every failure is counted in fairq_backend_scrape_failures_total;
    fairq_backend_healthy drops to 0 only where one failure reaches the threshold."""
    server = await fairq_factory(make_config(unhealthy_after_failures=threshold))
    seen: list[tuple[float, float]] = []  # (healthy, failures) as of each scrape's start
    fourth = asyncio.Event()

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        # The scrape this request belongs to (0-based). aiohttp retries a GET once on a new
        # connection when the server hangs up: that retry is part of the same scrape.
        entry = server.core.backend("flaky")  # registered after its first scrape
        scrape = 0 if entry is None else entry.scrapes + entry.failures
        if scrape == len(seen):
            seen.append((_sample(server, "fairq_backend_healthy"),
                         _sample(server, "fairq_backend_scrape_failures_total")))  # fmt: skip
        if len(seen) == 4:
            fourth.set()
        if scrape == 1:
            return await hang_up(request)
        return reply(text=IDLE_VLLM)

    async with serve(handler) as url:
        backend = VllmBackend("flaky", url, ["m"])
        await server.core.register_backend(
            BackendConfig("flaky", "vllm", url, ("m",)), backend=backend
        )
        try:
            async with asyncio.timeout(10):
                await fourth.wait()
        finally:
            # Stops the poller and closes the backend's connections before the server goes.
            await server.core.deregister_backend("flaky", drain=False)
    # As of scrape 2 (after the good first one), 3 (after the hang-up), 4 (after recovery).
    assert seen[1:4] == [(1.0, 0.0), (gauge_after_failure, 1.0), (1.0, 1.0)]
