"""Real vLLM, reached with plain httpx: the behaviour fairq's adapters and gate rely on.

These pin the facts fairq is built on: the streaming contract, the metric names the poller
scrapes, that a client disconnect frees the backend slot, and that the backend's FIFO queue
starves a light user behind a power user (the problem fairq solves).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from .flood import TEST_FLOOD, measure_alone, run_flood
from .openai_http import (
    DONE,
    completions_sender,
    flood_client,
    is_idle,
    iter_sse_data,
    metric_value,
    scrape_metrics,
    wait_for_metrics,
)
from .vllm_process import VllmProcess

pytestmark = pytest.mark.vllm


async def _stream_events(
    client: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> tuple[list[dict[str, Any]], str]:
    """POST a streaming request; return the JSON events and the final raw payload."""
    events: list[dict[str, Any]] = []
    last = ""
    async with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        async for data in iter_sse_data(response):
            last = data
            if data != DONE:
                events.append(json.loads(data))
    return events, last


def _finish_reasons(events: list[dict[str, Any]]) -> list[str]:
    return [c["finish_reason"] for e in events for c in e["choices"] if c.get("finish_reason")]


async def test_completions_stream_ends_with_done_and_finish_reason(
    vllm_fcfs: VllmProcess,
) -> None:
    body = {
        "model": vllm_fcfs.model,
        "prompt": "def fair(queue):",
        "max_tokens": 8,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with httpx.AsyncClient(timeout=30) as client:
        events, last = await _stream_events(client, f"{vllm_fcfs.url}/v1/completions", body)

    assert last == DONE
    assert _finish_reasons(events) == ["length"]
    assert "".join(c["text"] for e in events for c in e["choices"])
    assert events[-1]["usage"]["completion_tokens"] == 8


async def test_chat_stream_ends_with_done_and_finish_reason(vllm_fcfs: VllmProcess) -> None:
    body = {
        "model": vllm_fcfs.model,
        "messages": [{"role": "user", "content": "Who goes next?"}],
        "max_tokens": 8,
        "ignore_eos": True,
        "stream": True,
    }
    async with httpx.AsyncClient(timeout=30) as client:
        events, last = await _stream_events(client, f"{vllm_fcfs.url}/v1/chat/completions", body)

    assert last == DONE
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert _finish_reasons(events) == ["length"]
    assert "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])


async def test_fcfs_server_accepts_priority_field_silently(vllm_fcfs: VllmProcess) -> None:
    # Why fairq cannot probe for priority support: an fcfs vLLM takes the field with a 200.
    body = {"model": vllm_fcfs.model, "prompt": "x", "max_tokens": 2, "priority": 5}
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(f"{vllm_fcfs.url}/v1/completions", json=body)

    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in {"length", "stop"}


async def test_metrics_parse_and_expose_the_series_the_gate_uses(vllm_fcfs: VllmProcess) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        families = {f.name: f for f in await scrape_metrics(client, vllm_fcfs.url)}

    assert families["vllm:num_requests_waiting"].type == "gauge"
    assert families["vllm:num_requests_running"].type == "gauge"
    tpot = families["vllm:request_time_per_output_token_seconds"]
    assert tpot.type == "histogram"
    suffixes = {s.name.removeprefix(tpot.name) for s in tpot.samples}
    assert {"_bucket", "_sum", "_count"} <= suffixes
    assert any(s.labels.get("le") == "+Inf" for s in tpot.samples)


async def test_client_disconnect_frees_the_running_slot(vllm_fcfs: VllmProcess) -> None:
    max_tokens = 400
    async with httpx.AsyncClient(timeout=30) as client:
        before = await wait_for_metrics(client, vllm_fcfs.url, is_idle)
        tokens_before = metric_value(before, "vllm:generation_tokens_total")
        assert tokens_before is not None
        body = {
            "model": vllm_fcfs.model,
            "prompt": "Tell me everything",
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        async with client.stream("POST", f"{vllm_fcfs.url}/v1/completions", json=body) as resp:
            received = 0
            async for data in iter_sse_data(resp):
                received += data != DONE
                if received == 3:
                    break  # leaving the block closes the unfinished response: a disconnect
        assert received == 3

        after = await wait_for_metrics(client, vllm_fcfs.url, is_idle, timeout_s=30)

    tokens_after = metric_value(after, "vllm:generation_tokens_total")
    assert tokens_after is not None
    # Proves an abort rather than a request that simply ran to completion. (vLLM does not
    # count client disconnects in request_success_total{finished_reason="abort"}.)
    assert tokens_after - tokens_before < max_tokens


async def test_fifo_backend_starves_light_user_behind_power_user(vllm_fcfs: VllmProcess) -> None:
    config = TEST_FLOOD
    async with flood_client() as client:
        await wait_for_metrics(client, vllm_fcfs.url, is_idle)
        send = completions_sender(client, vllm_fcfs.url, vllm_fcfs.model)
        alone_s = await measure_alone(send, config)

        peak_waiting = 0.0

        async def watch_queue() -> None:
            nonlocal peak_waiting
            while True:
                families = await scrape_metrics(client, vllm_fcfs.url)
                waiting = metric_value(families, "vllm:num_requests_waiting") or 0.0
                peak_waiting = max(peak_waiting, waiting)
                await asyncio.sleep(0.1)

        watcher = asyncio.create_task(watch_queue())
        try:
            result = await run_flood(send, config)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    ratio = result.light_ttft_s / alone_s
    print(
        f"\n[flood direct] light TTFT alone {alone_s * 1000:.1f} ms; {result.summary()}; "
        f"{ratio:.0f}x alone; peak vllm:num_requests_waiting {peak_waiting:.0f}"
    )
    # Preconditions: the light user arrived on time, behind a flood really queued in vLLM.
    assert result.light_submit_offset_s < config.light_delay_s + 0.5, "client was starved"
    assert peak_waiting >= config.power_requests - 10
    assert result.light_ttft_s > 20 * alone_s
