"""TGI mode over real HTTP: TGI 3.3's endpoints, event shapes and quirks."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from fairq_sim import SimConfig, SimServer, tgi_admission

from .helpers import wait_until

TGI = SimConfig(mode="tgi", model="tiny-tgi", speed=50.0)


def events(text: str) -> list[str]:
    return [block[len("data: ") :] for block in text.split("\n\n") if block.startswith("data: ")]


def parsed(text: str) -> list[Any]:
    return [json.loads(e) for e in events(text)]


async def test_generate_stream_quirks() -> None:
    async with SimServer(TGI) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        body = {"inputs": "Hello", "parameters": {"max_new_tokens": 3, "details": True}}
        resp = await client.post("/generate_stream", json=body)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream"
    assert "[DONE]" not in resp.text
    evs = parsed(resp.text)
    assert [e["index"] for e in evs] == [1, 2, 3]  # counts from 1
    assert list(evs[0]) == ["index", "token", "generated_text", "details"]
    assert list(evs[0]["token"]) == ["id", "text", "logprob", "special"]
    assert [e["generated_text"] for e in evs[:2]] == [None, None]
    assert evs[-1]["generated_text"] == "".join(e["token"]["text"] for e in evs)
    assert evs[-1]["details"] == {
        "finish_reason": "length",
        "generated_tokens": 3,
        "seed": None,
        "input_length": 3,
    }


async def test_generate_and_compat_route() -> None:
    async with SimServer(TGI) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        body = {"inputs": "Hello", "parameters": {"max_new_tokens": 4, "details": True}}
        plain = await client.post("/generate", json=body)
        compat = await client.post("/", json=body)
        compat_stream = await client.post("/", json=body | {"stream": True})
        no_details = await client.post(
            "/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 2}}
        )
    assert plain.status_code == 200
    details = plain.json()["details"]
    assert details["finish_reason"] == "length" and details["generated_tokens"] == 4
    assert details["prefill"] == [] and len(details["tokens"]) == 4
    assert plain.headers["x-generated-tokens"] == "4"
    # "/" answers a list and, for text-generation models, prepends the prompt by default.
    assert isinstance(compat.json(), list) and compat.json()[0]["generated_text"].startswith(
        "Hello"
    )
    assert parsed(compat_stream.text)[-1]["generated_text"].startswith("Hello")
    assert list(no_details.json()) == ["generated_text"]


async def test_eos_and_stop_sequence_finish_reasons() -> None:
    config = SimConfig(mode="tgi", speed=50.0, eos_mean_tokens=1.0)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        resp = await client.post(
            "/generate_stream",
            json={"inputs": "Hi", "parameters": {"max_new_tokens": 5, "details": True}},
        )
    last = parsed(resp.text)[-1]
    assert last["token"] == {
        "id": 2,
        "text": "</s>",
        "logprob": last["token"]["logprob"],
        "special": True,
    }
    assert last["details"]["finish_reason"] == "eos_token"
    assert last["generated_text"] == ""  # special tokens are skipped

    async with SimServer(TGI) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        probe = await client.post(
            "/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 6, "seed": 4}}
        )
        text = probe.json()["generated_text"]
        stop = text[-3:]
        resp = await client.post(
            "/generate",
            json={
                "inputs": "Hi",
                "parameters": {"max_new_tokens": 6, "seed": 4, "stop": [stop], "details": True},
            },
        )
    assert resp.json()["details"]["finish_reason"] == "stop_sequence"
    assert resp.json()["generated_text"].endswith(stop)  # TGI keeps the stop sequence


async def test_validation_errors_422_or_in_stream() -> None:
    async with SimServer(TGI) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        too_long = {"inputs": "Hi", "parameters": {"max_new_tokens": 600}}
        plain = await client.post("/generate", json=too_long)
        streamed = await client.post("/generate_stream", json=too_long)
        temperature = await client.post(
            "/generate", json={"inputs": "Hi", "parameters": {"temperature": 0}}
        )
        missing = await client.post("/generate", json={"parameters": {}})
        metrics = (await client.get("/metrics")).text
    assert plain.status_code == 422
    assert plain.json() == {
        "error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 512. "
        "Given: 2 `inputs` tokens and 600 `max_new_tokens`",
        "error_type": "validation",
    }
    assert streamed.status_code == 200  # errors arrive inside the stream
    assert parsed(streamed.text) == [plain.json()]
    assert (
        temperature.json()["error"]
        == "Input validation error: `temperature` must be strictly positive"
    )
    assert missing.status_code == 422 and missing.headers["content-type"].startswith("text/plain")
    assert "missing field `inputs`" in missing.text
    assert 'tgi_request_failure{err="validation"} 3' in metrics


async def test_overloaded_beyond_max_concurrent_requests() -> None:
    config = SimConfig(mode="tgi", speed=1.0, max_concurrent_requests=1)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        body = {"inputs": "Hi", "parameters": {"max_new_tokens": 300}}
        async with client.stream("POST", "/generate_stream", json=body) as first:
            lines = first.aiter_lines()
            await anext(lines)
            rejected = await client.post("/generate", json=body)
            rejected_stream = await client.post("/generate_stream", json=body)
        await wait_until(lambda: sim.state.in_flight == 0)
        accepted = await client.post(
            "/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 1}}
        )
        metrics = (await client.get("/metrics")).text
    assert rejected.status_code == 429
    assert rejected.json() == {"error": "Model is overloaded", "error_type": "overloaded"}
    assert rejected_stream.status_code == 200
    assert parsed(rejected_stream.text) == [rejected.json()]
    assert accepted.status_code == 200
    assert 'tgi_request_failure{err="overloaded"} 2' in metrics
    assert 'tgi_request_failure{err="dropped"} 1' in metrics  # the stream we walked away from


async def test_messages_api_stream_and_final() -> None:
    async with SimServer(TGI) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        body = {
            "model": "tgi",
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        resp = await client.post("/v1/chat/completions", json=body)
        final = await client.post(
            "/v1/chat/completions", json=body | {"stream": False, "model": "mine"}
        )
    raw = events(resp.text)
    assert raw[-1] == "[DONE]"
    chunks = [json.loads(e) for e in raw[:-1]]
    assert list(chunks[0]) == [
        "object",
        "id",
        "created",
        "model",
        "system_fingerprint",
        "choices",
        "usage",
    ]
    assert chunks[0]["id"] == "" and chunks[0]["model"] == "tiny-tgi"
    assert all(c["choices"][0]["delta"]["role"] == "assistant" for c in chunks[:3])
    assert [c["choices"][0]["finish_reason"] for c in chunks[:3]] == [None, None, "length"]
    assert chunks[3]["choices"] == [] and chunks[3]["usage"]["completion_tokens"] == 3
    assert final.json()["object"] == "chat.completion" and final.json()["model"] == "mine"
    assert final.json()["choices"][0]["message"]["role"] == "assistant"
    assert final.json()["usage"]["completion_tokens"] == 3


async def test_info_health_models() -> None:
    async with SimServer(TGI) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        info = (await client.get("/info")).json()
        health = await client.get("/health")
        models = (await client.get("/v1/models")).json()
    assert info["model_id"] == "tiny-tgi" and info["max_total_tokens"] == 512
    assert info["max_input_tokens"] == 511 and info["max_concurrent_requests"] == 128
    assert info["router"] == "text-generation-router"
    assert health.status_code == 200 and health.content == b""
    assert models["data"] == [
        {"id": "tiny-tgi", "object": "model", "created": 0, "owned_by": "tiny-tgi"}
    ]


async def test_abort_on_disconnect_while_queued() -> None:
    config = SimConfig(mode="tgi", speed=1.0, max_num_seqs=1)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        body = {"inputs": "Hi", "parameters": {"max_new_tokens": 300}}
        async with client.stream("POST", "/generate_stream", json=body) as first:
            lines = first.aiter_lines()  # keep a reference: a collected iterator closes the stream
            await anext(lines)
            waiter = asyncio.create_task(client.post("/generate_stream", json=body))
            await wait_until(lambda: sim.engine.waiting_count == 1)
            waiter.cancel()
            await wait_until(lambda: sim.engine.waiting_count == 0)
            assert sim.engine.running_count == 1
        await wait_until(lambda: sim.engine.running_count == 0 and sim.state.in_flight == 0)


async def test_keep_alive_comments_while_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tgi_admission, "KEEP_ALIVE_SECONDS", 0.02)
    config = SimConfig(mode="tgi", speed=1.0, max_num_seqs=1)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        blocker = asyncio.create_task(
            client.post("/generate", json={"inputs": "b", "parameters": {"max_new_tokens": 150}})
        )
        await wait_until(lambda: sim.engine.running_count == 1)
        queued = await client.post(
            "/generate_stream", json={"inputs": "q", "parameters": {"max_new_tokens": 2}}
        )
        await blocker
    blocks = queued.text.split("\n\n")
    assert blocks[0] == ":"  # axum's keep-alive comment, sent while nothing else is due
    assert [json.loads(b[6:])["index"] for b in blocks if b.startswith("data: ")] == [1, 2]


async def test_unknown_route_is_an_empty_404() -> None:
    async with SimServer(TGI) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        resp = await client.get("/nope")
    assert resp.status_code == 404 and resp.content == b""
