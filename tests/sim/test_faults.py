"""Fault injection: dropped streams, error rate, failing or slow metrics, slow start."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from fairq_sim import SimConfig, SimServer

from .helpers import wait_until


async def read_until_cut(
    client: httpx.AsyncClient, path: str, body: dict[str, object]
) -> list[str]:
    lines: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError):
        async with client.stream("POST", path, json=body) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    lines.append(line)
    return lines


async def test_vllm_stream_dropped_after_n_tokens() -> None:
    config = SimConfig(speed=50.0, drop_after_tokens=3)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        lines = await read_until_cut(
            client, "/v1/completions", {"prompt": "x", "max_tokens": 10, "stream": True}
        )
        await wait_until(lambda: sim.engine.running_count == 0)
        metrics = (await client.get("/metrics")).text
        short = await client.post(
            "/v1/completions", json={"prompt": "x", "max_tokens": 2, "stream": True}
        )
    assert len(lines) == 3 and "data: [DONE]" not in lines
    assert 'finished_reason="abort",model_name="sim"} 1.0' in metrics
    assert short.text.endswith("data: [DONE]\n\n")  # shorter streams are not affected


async def test_tgi_stream_dropped_after_n_tokens() -> None:
    config = SimConfig(mode="tgi", speed=50.0, drop_after_tokens=2)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        lines = await read_until_cut(
            client, "/generate_stream", {"inputs": "x", "parameters": {"max_new_tokens": 9}}
        )
        await wait_until(lambda: sim.state.in_flight == 0)
        metrics = (await client.get("/metrics")).text
    assert len(lines) == 2 and all('"generated_text":null' in line for line in lines)
    assert 'tgi_request_failure{err="dropped"} 1' in metrics


async def test_error_rate_one_answers_500_before_any_token() -> None:
    config = SimConfig(speed=50.0, error_rate=1.0)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        plain = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        stream = await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}], "stream": True},
        )
    for resp in (plain, stream):
        assert resp.status_code == 500
        error = resp.json()["error"]
        assert error["type"] == "InternalServerError" and error["code"] == 500
    assert sim.engine.running_count == sim.engine.waiting_count == 0

    config = SimConfig(mode="tgi", speed=50.0, error_rate=1.0)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        tgi = await client.post("/generate_stream", json={"inputs": "x"})
    assert tgi.status_code == 500
    assert tgi.json() == {"error": "Incomplete generation", "error_type": "incomplete_generation"}


async def test_error_rate_is_seeded_and_can_change_at_runtime() -> None:
    async def pattern(seed: int) -> list[int]:
        config = SimConfig(speed=50.0, error_rate=0.5, seed=seed)
        async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
            codes = []
            for _ in range(16):
                resp = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
                codes.append(resp.status_code)
            sim.config.error_rate = 0.0
            after = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
            assert after.status_code == 200
            return codes

    first = await pattern(1)
    assert first == await pattern(1)
    assert set(first) == {200, 500}


async def test_metrics_failing_then_recovering() -> None:
    config = SimConfig(metrics_fail=True)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        failing = await client.get("/metrics")
        sim.config.metrics_fail = False
        working = await client.get("/metrics")
    assert failing.status_code == 500
    assert working.status_code == 200 and "vllm:num_requests_waiting" in working.text


async def test_slow_metrics() -> None:
    config = SimConfig(mode="tgi", metrics_delay=0.2)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        start = time.monotonic()
        resp = await client.get("/metrics")
        elapsed = time.monotonic() - start
    assert resp.status_code == 200 and elapsed >= 0.2


@pytest.mark.parametrize("mode", ["vllm", "tgi"])
async def test_slow_start_answers_503_until_ready(mode: str) -> None:
    config = SimConfig(mode=mode, speed=50.0, startup_delay=0.3)  # type: ignore[arg-type]
    path, body = (
        ("/v1/completions", {"prompt": "x", "max_tokens": 1})
        if mode == "vllm"
        else ("/generate", {"inputs": "x", "parameters": {"max_new_tokens": 1}})
    )
    # The delay runs from some moment after this one, so readiness cannot come sooner.
    before_start = time.monotonic()
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        health = await client.get("/health")
        early = await client.post(path, json=body)
        assert health.status_code == 503 and early.status_code == 503
        if mode == "tgi":
            assert health.json() == {"error": "unhealthy", "error_type": "healthcheck"}
        else:
            assert health.content == b""
        start = time.monotonic()
        while (await client.get("/health")).status_code != 200:  # poll as a health checker does
            assert time.monotonic() - start < 5
            await asyncio.sleep(0.02)
        assert time.monotonic() - before_start >= 0.3
        late = await client.post(path, json=body)
    assert late.status_code == 200
