"""fairq's own /metrics endpoint, scraped over HTTP and parsed like Prometheus would."""

from __future__ import annotations

from dataclasses import replace

import grpc
import httpx
from prometheus_client.parser import text_string_to_metric_families

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_server.sim import SimServer

from ..conftest import FairqFactory, make_config, sim_backend


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
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{server.metrics_port}/metrics")).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
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
