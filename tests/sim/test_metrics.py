"""Metrics: vLLM names/types/labels/buckets as recorded; TGI's exporter format."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fairq_sim import SimConfig, SimServer
from fairq_sim.tgi_metrics import rust_float

from .helpers import wait_until

FIXTURES = Path(__file__).parent.parent / "fixtures"
REQUIRED = {
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_running": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}


def families(text: str) -> dict[str, tuple[str, set[str], list[str]]]:
    """name -> (type, label names of its samples, bucket bounds)."""
    out = {}
    for family in text_string_to_metric_families(text):
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        les = [s.labels["le"] for s in family.samples if s.name.endswith("_bucket")]
        out[family.name] = (family.type, labels, les)
    return out


def value(text: str, sample: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError(sample)


async def test_vllm_metrics_match_recorded_names_types_labels_and_buckets() -> None:
    recorded = families((FIXTURES / "metrics-under-flood.txt").read_text())
    config = SimConfig(model="tiny", speed=50.0)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        await client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 5})
        resp = await client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    ours = families(resp.text)
    for name, kind in REQUIRED.items():
        assert ours[name][0] == kind, name
    for name, (kind, labels, les) in ours.items():
        if not name.startswith("vllm:"):
            continue
        assert name in recorded, f"{name} is not a vLLM 0.32 metric"
        rec_kind, rec_labels, rec_les = recorded[name]
        assert kind == rec_kind, name
        if name == "vllm:cache_config_info":
            assert labels <= rec_labels
        else:
            assert labels == rec_labels, name
        assert les == rec_les, name
    assert "process_start_time_seconds" in ours


async def test_vllm_metric_values_follow_the_engine() -> None:
    config = SimConfig(model="tiny", speed=50.0, block_size=4)
    prompt = "The same long system prompt, shared by both requests. " * 3
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        for suffix in ("first", "second"):
            await client.post("/v1/completions", json={"prompt": prompt + suffix, "max_tokens": 3})
        await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
        )
        text = (await client.get("/metrics")).text
    labels = {"model_name": "tiny", "engine": "0"}
    assert value(text, "vllm:generation_tokens_total", **labels) == 8
    assert value(text, "vllm:request_success_total", finished_reason="length", **labels) == 3
    assert value(text, "vllm:request_success_total", finished_reason="abort", **labels) == 0
    assert value(text, "vllm:time_to_first_token_seconds_count", **labels) == 3
    assert value(text, "vllm:inter_token_latency_seconds_count", **labels) == 5
    assert value(text, "vllm:e2e_request_latency_seconds_count", **labels) == 3
    assert value(text, "vllm:request_time_per_output_token_seconds_count", **labels) == 3
    hits = value(text, "vllm:prefix_cache_hits_total", **labels)
    queries = value(text, "vllm:prefix_cache_queries_total", **labels)
    prompt_tokens = value(text, "vllm:prompt_tokens_total", **labels)
    assert hits >= 40 and hits % 4 == 0  # the second prompt reuses the first one's blocks
    assert queries == prompt_tokens
    assert value(text, "vllm:num_requests_running", **labels) == 0
    assert value(text, "vllm:kv_cache_usage_perc", **labels) == 0


async def test_vllm_gauges_under_load() -> None:
    config = SimConfig(model="tiny", speed=1.0, max_num_seqs=2)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        tasks = [
            asyncio.create_task(
                client.post("/v1/completions", json={"prompt": "p", "max_tokens": 200})
            )
            for _ in range(5)
        ]
        await wait_until(lambda: sim.engine.running_count == 2 and sim.engine.waiting_count == 3)
        text = (await client.get("/metrics")).text
        for task in tasks:
            task.cancel()
    labels = {"model_name": "tiny", "engine": "0"}
    assert value(text, "vllm:num_requests_running", **labels) == 2
    assert value(text, "vllm:num_requests_waiting", **labels) == 3
    assert value(text, "vllm:kv_cache_usage_perc", **labels) > 0


async def test_tgi_metrics_format_and_first_use() -> None:
    config = SimConfig(mode="tgi", speed=50.0)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        fresh = (await client.get("/metrics")).text
        await client.post("/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 4}})
        used = (await client.get("/metrics")).text
    assert "tgi_request_count" not in fresh  # series appear on first use
    assert "tgi_batch_max_total_tokens 512\n" in fresh
    assert "_total" not in used.replace("tgi_batch_max_total_tokens", "")
    assert "_created" not in used
    assert "# TYPE tgi_request_count counter\ntgi_request_count 1\n\n" in used
    assert (
        "# HELP tgi_queue_size Current queue size\n# TYPE tgi_queue_size gauge\ntgi_queue_size 0\n"
        in used
    )
    assert 'tgi_request_duration_bucket{le="0.00015000000000000001"} 0\n' in used
    assert "tgi_request_failure" not in used
    fams = families(used)
    for name, kind in {
        "tgi_request_count": "counter",
        "tgi_request_success": "counter",
        "tgi_queue_size": "gauge",
        "tgi_batch_current_size": "gauge",
        "tgi_request_mean_time_per_token_duration": "histogram",
        "tgi_request_queue_duration": "histogram",
        "tgi_request_duration": "histogram",
        "tgi_request_generated_tokens": "histogram",
        "tgi_batch_forward_duration": "histogram",
    }.items():
        assert fams[name][0] == kind, name
    assert len(fams["tgi_request_duration"][2]) == 36  # 35 geometric bounds and +Inf
    assert value(used, "tgi_request_generated_tokens_sum") == 4
    assert value(used, "tgi_request_mean_time_per_token_duration_count") == 1


def test_rust_float_formatting() -> None:
    assert rust_float(3.0) == "3"
    assert rust_float(0.5) == "0.5"
    assert rust_float(1e-7) == "0.0000001"
    assert rust_float(0.0001 * 1.5) == "0.00015000000000000001"
