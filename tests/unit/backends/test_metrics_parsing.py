"""Parsing recorded vLLM 0.32 /metrics output (tests/fixtures) and TGI-shaped text."""

from __future__ import annotations

from pathlib import Path

import pytest

from fairq_server.backends.tgi import TgiBackend
from fairq_server.backends.vllm import VllmBackend

FIXTURES = Path(__file__).parents[2] / "fixtures"


@pytest.fixture
async def vllm() -> VllmBackend:
    return VllmBackend("v", "http://127.0.0.1:1", ["tiny"])


async def test_idle_metrics(vllm: VllmBackend) -> None:
    sample = vllm.parse_metrics((FIXTURES / "metrics-idle.txt").read_text())
    assert sample.waiting == 0
    assert sample.running == 0
    assert sample.kv_usage == 0


async def test_flood_metrics(vllm: VllmBackend) -> None:
    sample = vllm.parse_metrics((FIXTURES / "metrics-under-flood.txt").read_text())
    assert sample.waiting == 56
    assert sample.running == 4
    assert sample.kv_usage == pytest.approx(0.0009766817238432424)
    # request_time_per_output_token is preferred over inter_token_latency when present
    assert sample.tpot_count == 4
    assert sample.tpot_sum == pytest.approx(0.009871899017561622)


async def test_falls_back_to_inter_token_latency(vllm: VllmBackend) -> None:
    text = "\n".join(
        line
        for line in (FIXTURES / "metrics-under-flood.txt").read_text().splitlines()
        if "request_time_per_output_token" not in line
    )
    sample = vllm.parse_metrics(text + "\n")
    assert sample.tpot_count == 649
    assert sample.tpot_sum == pytest.approx(1.926519889000133)


async def test_metrics_without_queue_gauges_are_rejected(vllm: VllmBackend) -> None:
    with pytest.raises(ValueError, match="num_requests_waiting"):
        vllm.parse_metrics("# HELP x y\n# TYPE x gauge\nx 1\n")


async def test_tgi_metrics_without_series_mean_idle() -> None:
    tgi = TgiBackend("t", "http://127.0.0.1:1", ["m"])
    assert tgi.parse_metrics("").waiting == 0
    text = (
        "# TYPE tgi_queue_size gauge\ntgi_queue_size 3\n"
        "# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 2\n"
        "# TYPE tgi_request_mean_time_per_token_duration histogram\n"
        'tgi_request_mean_time_per_token_duration_bucket{le="+Inf"} 4\n'
        "tgi_request_mean_time_per_token_duration_sum 0.2\n"
        "tgi_request_mean_time_per_token_duration_count 4\n"
    )
    sample = tgi.parse_metrics(text)
    assert (sample.waiting, sample.running, sample.tpot_count) == (3, 2, 4)
    assert sample.tpot_sum == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("series", "value"),
    [
        ("vllm:num_requests_waiting", "NaN"),
        ("vllm:num_requests_waiting", "+Inf"),
        ("vllm:num_requests_running", "-1"),
        ("vllm:kv_cache_usage_perc", "NaN"),
    ],
)
async def test_a_nan_infinite_or_negative_value_fails_the_parse(
    vllm: VllmBackend, series: str, value: str
) -> None:
    """Fail closed: max(0.0, nan) is 0.0, which would read as an idle backend."""
    text = (FIXTURES / "metrics-idle.txt").read_text()
    lines = [
        f'{series}{{engine="0",model_name="tiny"}} {value}' if line.startswith(series) else line
        for line in text.splitlines()
    ]
    with pytest.raises(ValueError, match="not a finite number >= 0"):
        vllm.parse_metrics("\n".join(lines) + "\n")
