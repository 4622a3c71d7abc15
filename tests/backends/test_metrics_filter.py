"""vLLM's metrics asked for by name, and the whole exposition where the exporter cannot filter.

The scripted exporter renders with prometheus_client itself (the library vLLM exports with),
so ``name[]`` is applied as vLLM's ``/metrics/`` applies it; variants refuse the filtered path,
answer it with nothing (a multiprocess collector), or hang up on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from fairq_server.backends.openai import MetricMap, OpenAIBackend
from fairq_server.backends.vllm import VllmBackend
from fairq_server.errors import BackendError

from ..scripted_http import reply, serve


def vllm_registry() -> CollectorRegistry:
    """The samples fairq reads, and a large histogram it does not (vLLM has dozens)."""
    registry = CollectorRegistry()
    labels = ("engine", "model_name")
    Gauge("vllm:num_requests_waiting", "", labels, registry=registry).labels("0", "m").set(3)
    Gauge("vllm:num_requests_running", "", labels, registry=registry).labels("0", "m").set(8)
    Gauge("vllm:kv_cache_usage_perc", "", labels, registry=registry).labels("0", "m").set(0.25)
    tpot = Histogram(
        "vllm:request_time_per_output_token_seconds", "", labels, registry=registry
    ).labels("0", "m")
    for value in (0.01, 0.02, 0.03):
        tpot.observe(value)
    unread = Histogram(
        "vllm:e2e_request_latency_seconds", "", labels, registry=registry,
        buckets=[i / 10 for i in range(1, 200)],
    )  # fmt: skip
    unread.labels("0", "m").observe(1.0)
    return registry


Exporter = Callable[[web.BaseRequest, CollectorRegistry], web.StreamResponse]


def filtering(request: web.BaseRequest, registry: CollectorRegistry) -> web.StreamResponse:
    """As vLLM: ``/metrics`` renders everything, ``/metrics/`` only the samples named."""
    names = request.query.getall("name[]", [])
    if request.path == "/metrics/" and names:
        return reply(text=generate_latest(registry.restricted_registry(names)).decode())
    return reply(text=generate_latest(registry).decode())


def refusing(request: web.BaseRequest, registry: CollectorRegistry) -> web.StreamResponse:
    """No ``/metrics/`` at all."""
    if request.path == "/metrics/":
        return reply(404, json_body={"detail": "Not Found"})
    return reply(text=generate_latest(registry).decode())


def empty(request: web.BaseRequest, registry: CollectorRegistry) -> web.StreamResponse:
    """A filter that finds nothing (prometheus_client's multiprocess collector has no names)."""
    if request.path == "/metrics/":
        return reply(text="")
    return reply(text=generate_latest(registry).decode())


class Exported:
    """A scripted exporter that records each scrape's path, query and answer size."""

    def __init__(self, exporter: Exporter) -> None:
        self.exporter = exporter
        self.registry = vllm_registry()
        self.seen: list[tuple[str, tuple[str, ...], int]] = []

    def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.path == "/v1/models":
            return reply(json_body={"object": "list", "data": [{"id": "m", "object": "model"}]})
        answer = self.exporter(request, self.registry)
        assert isinstance(answer, web.Response) and answer.body is not None
        size = len(answer.body) if isinstance(answer.body, bytes) else -1
        self.seen.append((request.path, tuple(request.query.getall("name[]", [])), size))
        return answer


async def test_vllm_is_asked_for_the_samples_it_reads_only() -> None:
    exported = Exported(filtering)
    async with serve(exported) as url:
        backend = VllmBackend("v", url, ["m"])
        try:
            first = await backend.scrape(5.0)
            second = await backend.scrape(5.0)
        finally:
            await backend.aclose()
    assert backend.metrics_filtered
    for sample in (first, second):
        assert (sample.waiting, sample.running, sample.kv_usage) == (3.0, 8.0, 0.25)
        assert sample.tpot_count == 3.0 and sample.tpot_sum == pytest.approx(0.06)
        assert sample.missing == ()
    assert [(path, set(names)) for path, names, _ in exported.seen] == [
        ("/metrics/", set(VllmBackend.metrics_filter))
    ] * 2
    whole = len(generate_latest(exported.registry))
    assert all(size < whole / 10 for _, _, size in exported.seen), (exported.seen, whole)


@pytest.mark.parametrize("exporter", [refusing, empty], ids=["404", "empty"])
async def test_an_exporter_that_cannot_filter_is_read_whole_from_then_on(
    exporter: Exporter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    exported = Exported(exporter)
    async with serve(exported) as url:
        backend = VllmBackend("v", url, ["m"])
        try:
            samples = [await backend.scrape(5.0) for _ in range(3)]
        finally:
            await backend.aclose()
    assert not backend.metrics_filtered
    assert all((s.waiting, s.running, s.tpot_count) == (3.0, 8.0, 3.0) for s in samples)
    # One filtered try, then the whole exposition for that scrape and every later one.
    assert [path for path, _, _ in exported.seen] == ["/metrics/"] + ["/metrics"] * 3
    [warning] = [r.getMessage() for r in caplog.records if "by name" in r.getMessage()]
    assert "backend v" in warning and "reading the whole /metrics" in warning
    assert ("HTTP 404" in warning) == (exporter is refusing)


async def test_a_filtered_scrape_that_times_out_keeps_the_filter() -> None:
    """A slow or unreachable backend is a failed scrape, not a reason to read it whole."""
    calls: list[str] = []

    async def slow_once(request: web.BaseRequest) -> web.StreamResponse:
        calls.append(request.path)
        if len(calls) == 1:
            # Real clock: aiohttp's 0.3 s timeout runs on the loop's own; the exporter stalls.
            await asyncio.sleep(2.0)
        return filtering(request, vllm_registry())

    async with serve(slow_once) as url:
        backend = VllmBackend("v", url, ["m"])
        try:
            with pytest.raises(BackendError, match="metrics unreachable"):
                await backend.scrape(0.3)
            assert (await backend.scrape(5.0)).running == 8.0
        finally:
            await backend.aclose()
    assert backend.metrics_filtered and calls == ["/metrics/", "/metrics/"]


async def test_an_exposition_unreadable_either_way_fails_and_keeps_the_filter() -> None:
    """A broken exporter fails the scrape with the whole exposition's reason."""
    paths: list[str] = []

    def broken(request: web.BaseRequest) -> web.StreamResponse:
        paths.append(request.path)
        return reply(text='vllm:num_requests_waiting{engine="0"} NaN\n')

    async with serve(broken) as url:
        backend = VllmBackend("v", url, ["m"])
        try:
            with pytest.raises(BackendError, match="unreadable metrics"):
                await backend.scrape(5.0)
        finally:
            await backend.aclose()
    assert paths == ["/metrics/", "/metrics"] and backend.metrics_filtered


async def test_the_openai_kind_reads_its_exposition_whole() -> None:
    """SGLang's and llama.cpp's exporters do not filter (or answer nothing): no name[]."""
    exported = Exported(filtering)
    async with serve(exported) as url:
        names = MetricMap(waiting="vllm:num_requests_waiting", running="vllm:num_requests_running")
        backend = OpenAIBackend("o", url, ["m"], metrics=names)
        try:
            assert (await backend.scrape(5.0)).waiting == 3.0
        finally:
            await backend.aclose()
    assert OpenAIBackend.metrics_filter == () and not backend.metrics_filtered
    scrapes = [(path, names) for path, names, _ in exported.seen if path.startswith("/metrics")]
    assert scrapes == [("/metrics", ())]
