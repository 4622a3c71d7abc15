"""The ``llamacpp`` preset against what current llama-server exports, and a metric the
configuration relies on that a backend lacks: said at the first scrape (log, metric,
``ListBackends`` reason), not silently ignored.

``tests/fixtures/llamacpp-metrics.txt`` holds every series llama-server's ``/metrics`` writes
(its counters and gauges, names and help text as in its server source; values made up).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from aiohttp import web

from fairq.v1 import admin_pb2, admin_pb2_grpc
from fairq_server.backends.openai import METRIC_PRESETS, OpenAIBackend
from fairq_server.config.schema import BackendConfig, TierConfig
from fairq_server.scheduling.metric_gaps import gaps, relied_on

from ..conftest import FairqFactory, make_config

LLAMA_METRICS = (Path(__file__).parents[1] / "fixtures" / "llamacpp-metrics.txt").read_text()


def exported(text: str) -> set[str]:
    return {line.split()[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_llamacpp_preset_names_only_what_llama_server_exports() -> None:
    assert set(METRIC_PRESETS["llamacpp"].wanted()) <= exported(LLAMA_METRICS)
    cfg = BackendConfig("l", "openai", "http://h:1", ("m",), metrics_preset="llamacpp")
    sample = OpenAIBackend.from_config(cfg, timeout=1).parse_metrics(LLAMA_METRICS)
    assert (sample.waiting, sample.running, sample.tpot_count) == (0.0, 1.0, 640.0)
    assert sample.kv_usage is None and sample.missing == (("kv_usage", ""),)
    # Missing is a gap only for what the configuration relies on.
    assert gaps(sample, relied_on([TierConfig("t", 3)])) == ()
    assert gaps(sample, relied_on([TierConfig("t", 3, kv_usage_limit=0.9)])) == (("kv_usage", ""),)
    # A name the configuration maps is relied on as such.
    named = replace(cfg, kv_usage_metric="llamacpp:kv_cache_usage_ratio")
    sample = OpenAIBackend.from_config(named, timeout=1).parse_metrics(LLAMA_METRICS)
    assert gaps(sample, frozenset()) == (("kv_usage", "llamacpp:kv_cache_usage_ratio"),)


@pytest.fixture
async def llama_server() -> AsyncIterator[str]:
    """A stand-in for llama-server's /metrics and /v1/models on loopback."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=LLAMA_METRICS, content_type="text/plain")

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "llama"}]})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def test_a_limit_without_its_metric_is_said_at_the_first_scrape(
    llama_server: str, fairq_factory: FairqFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    backend = BackendConfig("llama", "openai", llama_server, ("llama",), metrics_preset="llamacpp")
    tiers = (TierConfig("interactive", 3, kv_usage_limit=0.0001), TierConfig("batch", 0))
    server = await fairq_factory(replace(make_config([backend]), tiers=tiers))
    await server.core.dispatcher.sync()
    entry = server.core.backend("llama")
    assert entry is not None and entry.healthy is True
    [warning] = [r for r in caplog.records if "/metrics lacks" in r.getMessage()]
    assert warning.levelname == "WARNING"
    assert "no kv usage metric (read by kv_usage_limit)" in warning.getMessage()
    registry = server.core.telemetry.registry
    labels = {"backend": "llama", "metric": "kv_usage"}
    assert registry.get_sample_value("fairq_backend_metric_missing", labels) == 1
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        listed = await admin_pb2_grpc.AdminStub(ch).ListBackends(admin_pb2.ListBackendsRequest())
    [status] = listed.backends
    assert status.healthy and "kv_usage_limit" in status.reason
    # Once only: later scrapes find the same gap and say nothing more.
    await server.core._polled["llama"].poller.poll_once()
    await server.core.dispatcher.sync()
    assert len([r for r in caplog.records if "/metrics lacks" in r.getMessage()]) == 1
