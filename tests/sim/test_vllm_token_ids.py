"""vLLM mode's ``return_token_ids``: the ids stream as vLLM 0.32 sends them, and a
continuation sent as prompt ids plus output ids reads the aborted request's blocks from the
prefix cache, as on the real engine (fairq's token-exact continuation after a preemption)."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

from fairq_sim import SimConfig, SimServer

from .helpers import wait_until
from .test_vllm_http import FAST, fixture_events, shape, sse_events


def _events(text: str) -> list[Any]:
    return [json.loads(e) if e != "[DONE]" else e for e in sse_events(text)]


def _hits(metrics: str) -> float:
    match = re.search(r"^vllm:prefix_cache_hits_total\{[^}]*\} ([0-9.e+]+)$", metrics, re.M)
    assert match is not None
    return float(match.group(1))


async def test_completion_stream_with_token_ids_matches_recorded_shape() -> None:
    async with SimServer(FAST) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        body = {"model": "tiny", "prompt": "Hello", "max_tokens": 4, "stream": True,
                "return_token_ids": True, "stream_options": {"include_usage": True}}  # fmt: skip
        events = _events((await client.post("/v1/completions", json=body)).text)
    recorded = fixture_events("completions-stream-token-ids.sse")
    assert len(events) == len(recorded) == 6
    # The first chunk carries the prompt's ids, the later ones null, as recorded.
    for got, want in zip(events[:4], recorded[:4], strict=True):
        assert shape(got) == shape(want)
    choices = [e["choices"][0] for e in events[:4]]
    assert choices[0]["prompt_token_ids"] and len(choices[0]["prompt_token_ids"]) == 3
    assert all(len(c["token_ids"]) == 1 for c in choices)


async def test_chat_stream_with_token_ids_matches_recorded_shape() -> None:
    async with SimServer(FAST) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 3, "stream": True, "return_token_ids": True}  # fmt: skip
        events = _events((await client.post("/v1/chat/completions", json=body)).text)
    recorded = fixture_events("chat-stream-token-ids.sse")
    assert len(events) == len(recorded) == 5
    # The last chunk is left out: without a usage chunk vLLM puts its system_fingerprint
    # there, which the simulator does not model.
    for got, want in zip(events[:-2], recorded[:-2], strict=True):
        assert shape(got) == shape(want)
    assert events[0]["prompt_token_ids"]
    assert [len(e["choices"][0]["token_ids"]) for e in events[1:4]] == [1, 1, 1]


async def test_without_the_field_the_ids_stay_null() -> None:
    async with SimServer(FAST) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        body = {"model": "tiny", "prompt": "Hello", "max_tokens": 2, "stream": True}
        events = _events((await client.post("/v1/completions", json=body)).text)
    assert [e["choices"][0]["token_ids"] for e in events[:2]] == [None, None]
    assert events[0]["choices"][0]["prompt_token_ids"] is None


async def test_a_continuation_by_ids_hits_the_aborted_requests_blocks() -> None:
    config = SimConfig(model="tiny", speed=5.0, block_size=16)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        body = {"model": "tiny", "prompt": "Write a long report on queues.", "max_tokens": 400,
                "ignore_eos": True, "stream": True, "return_token_ids": True}  # fmt: skip
        prompt: list[int] = []
        output: list[int] = []
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            async for line in resp.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                choice = json.loads(line[6:])["choices"][0]
                prompt = prompt or choice["prompt_token_ids"]
                output += choice["token_ids"]
                if len(output) >= 60:
                    break  # the client goes away: the engine aborts the request
        await wait_until(lambda: sim.engine.running_count == 0)
        before = _hits((await client.get("/metrics")).text)
        resumed = {"model": "tiny", "prompt": prompt + output, "max_tokens": 2}
        assert (await client.post("/v1/completions", json=resumed)).status_code == 200
        hits = _hits((await client.get("/metrics")).text) - before
    # Every whole block of prompt and output the aborted request computed is a hit.
    assert hits == (len(prompt) + len(output)) // 16 * 16
