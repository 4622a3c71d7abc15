"""The ext_proc door behind a real Envoy: streams whole, refusals, the slot's life."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

import aiohttp

from fairq_bench.envoy_process import EnvoyProcess, free_port
from fairq_server.config.entitlement import QuotaConfig
from fairq_server.config.schema import KeyConfig
from fairq_server.identity.auth import hash_key
from fairq_sim import SimConfig, SimServer

from ..conftest import FairqFactory, make_config, sim_backend
from ..http.test_door import CHAT, post, until
from .conftest import Stack, start_stack, with_extproc

CHAT_URL = "/v1/chat/completions"


async def read_stream(url: str, body: object, headers: dict[str, str] | None = None) -> bytes:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers=headers or {}) as resp,
    ):
        assert resp.status == 200, await resp.text()
        return await resp.read()


def events(raw: bytes) -> list[Any]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def text_of(raw: bytes) -> str:
    return "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in events(raw)
        if isinstance(c, dict) and c.get("choices")
    )


async def test_a_stream_passes_through_whole_and_is_charged_once(stack: Stack) -> None:
    body = {**CHAT, "stream": True, "max_tokens": 12, "user": "ann"}
    through = await read_stream(stack.url + CHAT_URL, body)
    got = events(through)
    assert got[-1] == "[DONE]"
    # The backend's own chunks, as the backend sent them: every token, then the usage.
    content = [c for c in got if isinstance(c, dict) and c.get("choices")]
    assert sum(1 for c in content if c["choices"][0]["delta"].get("content")) == 12
    usage = [c["usage"] for c in got if isinstance(c, dict) and c.get("usage")]
    assert usage and usage[-1]["completion_tokens"] == 12
    core = stack.server.core
    await until(lambda: core.live_requests() == 0)
    # Charged once, from the backend's usage block: 12 completion tokens.
    samples = [
        s
        for metric in core.telemetry.registry.collect()
        if metric.name == "fairq_tokens"
        for s in metric.samples
        if s.name == "fairq_tokens_total" and s.labels["kind"] == "completion"
    ]
    assert sum(s.value for s in samples) == 12, samples


async def test_without_the_usage_read_the_tokens_are_estimated_from_the_bytes(
    sim: SimServer, fairq_factory: FairqFactory, envoys: list[EnvoyProcess]
) -> None:
    config = with_extproc(make_config([sim_backend(sim)]))
    server = await fairq_factory(config)
    envoy = EnvoyProcess([("fairq", config.extproc.listen)], read_usage=False)
    envoys.append(envoy)
    await asyncio.to_thread(envoy.start)
    raw = await read_stream(envoy.url + CHAT_URL, {**CHAT, "stream": True, "max_tokens": 20})
    assert events(raw)[-1] == "[DONE]"
    await until(lambda: server.core.live_requests() == 0)
    samples = [
        s.value
        for metric in server.core.telemetry.registry.collect()
        if metric.name == "fairq_tokens"
        for s in metric.samples
        if s.name == "fairq_tokens_total" and s.labels["kind"] == "completion"
    ]
    # An estimate: the body's bytes at 200 a token (about one SSE chunk each).
    assert sum(samples) == len(raw) // 200


async def test_a_non_streamed_answer_and_the_models_list(stack: Stack) -> None:
    status, _, doc = await post(stack.url + CHAT_URL, CHAT)
    assert status == 200, doc
    assert doc["usage"]["completion_tokens"] == 4
    async with aiohttp.ClientSession() as session, session.get(stack.url + "/v1/models") as resp:
        assert resp.status == 200
        assert [m["id"] for m in (await resp.json())["data"]] == ["sim"]


async def test_a_client_sent_destination_is_not_obeyed(stack: Stack) -> None:
    # The header names a port nobody listens on: stripped, fairq's choice stands.
    status, _, doc = await post(
        stack.url + CHAT_URL, CHAT, {"x-gateway-destination-endpoint": f"127.0.0.1:{free_port()}"}
    )
    assert status == 200, doc


async def test_bad_requests_get_the_http_doors_answers(stack: Stack) -> None:
    status, _, doc = await post(stack.url + CHAT_URL, {"model": "nope", "messages": []})
    assert status in (400, 404), doc
    assert set(doc) == {"error"}
    status, _, doc = await post(stack.url + "/v1/embeddings", {"model": "sim"})
    assert status == 404


async def test_keys_are_checked_and_not_passed_to_the_backend(
    sim: SimServer, fairq_factory: FairqFactory, envoys: list[EnvoyProcess]
) -> None:
    keys = [KeyConfig("ann", hash_key("ann-key"))]
    config = with_extproc(make_config([sim_backend(sim)], keys=keys))
    stack = await start_stack(fairq_factory, sim, config, envoys)
    status, _, doc = await post(stack.url + CHAT_URL, CHAT)
    assert status == 401, doc
    assert doc["error"]["type"] == "authentication_error" or "error" in doc
    status, _, doc = await post(stack.url + CHAT_URL, CHAT, {"authorization": "Bearer ann-key"})
    assert status == 200, doc


async def test_a_quota_refuses_with_429_and_retry_after(
    sim: SimServer, fairq_factory: FairqFactory, envoys: list[EnvoyProcess]
) -> None:
    config = with_extproc(
        replace(
            make_config([sim_backend(sim)]), quotas=(QuotaConfig(user="*", requests_per_minute=1),)
        )
    )
    stack = await start_stack(fairq_factory, sim, config, envoys)
    ann = {"x-fairq-user": "ann"}
    status, _, doc = await post(stack.url + CHAT_URL, CHAT, ann)
    assert status == 200, doc
    status, headers, doc = await post(stack.url + CHAT_URL, {**CHAT, "stream": True}, ann)
    assert status == 429, doc
    assert int({k.lower(): v for k, v in headers.items()}["retry-after"]) >= 1
    assert doc["error"]["type"] == "rate_limit_exceeded"
    status, _, _ = await post(stack.url + CHAT_URL, CHAT, {"x-fairq-user": "bob"})
    assert status == 200


async def test_a_client_gone_frees_its_slot_at_once(
    fairq_factory: FairqFactory, envoys: list[EnvoyProcess]
) -> None:
    async with SimServer(SimConfig(mode="vllm", model="sim", speed=1.0, max_num_seqs=4)) as slow:
        config = with_extproc(make_config([sim_backend(slow, max_in_flight=1)]))
        stack = await start_stack(fairq_factory, slow, config, envoys)
        core = stack.server.core
        body = {**CHAT, "stream": True, "max_tokens": 400}
        async with aiohttp.ClientSession() as session:
            # One long stream holds the only slot; a second request queues behind it.
            resp = await session.post(stack.url + CHAT_URL, json=body)
            await resp.content.readuntil(b"\n\n")
            queued = asyncio.create_task(post(stack.url + CHAT_URL, CHAT))
            await until(lambda: core.live_requests() == 2)
            started = time.monotonic()
            resp.close()  # the client goes away mid-stream
            status, _, doc = await queued
            assert status == 200, doc
            assert time.monotonic() - started < 3.0
        await until(lambda: core.live_requests() == 0)
        # A queued client gone leaves the queue at once.
        async with aiohttp.ClientSession() as session:
            resp = await session.post(stack.url + CHAT_URL, json=body)
            await resp.content.readuntil(b"\n\n")
            waiting = asyncio.create_task(post(stack.url + CHAT_URL, CHAT))
            await until(lambda: core.live_requests() == 2)
            waiting.cancel()
            await until(lambda: core.live_requests() == 1)
            resp.close()
        await until(lambda: core.live_requests() == 0)


async def test_fairq_down_is_a_fast_503(envoys: list[EnvoyProcess]) -> None:
    envoy = EnvoyProcess([("fairq", f"127.0.0.1:{free_port()}")])
    envoys.append(envoy)
    await asyncio.to_thread(envoy.start)
    started = time.monotonic()
    status, _, _ = await post(envoy.url + CHAT_URL, CHAT)
    assert status == 503
    assert time.monotonic() - started < 2.0


async def test_nothing_passes_unscheduled_when_fairq_refuses(stack: Stack) -> None:
    # No backend serves the model: 503 or 404 from fairq, and the simulator saw nothing.
    before = (
        stack.sim.engine.finished_count if hasattr(stack.sim.engine, "finished_count") else None
    )
    status, _, doc = await post(stack.url + CHAT_URL, {**CHAT, "model": "other"})
    assert status in (404, 503), doc
    assert set(doc) == {"error"}
    del before


async def test_a_body_past_envoys_default_buffer_reaches_fairq(stack: Stack) -> None:
    # 1.5 MB: past Envoy's 1 MiB default, within fairq's 8 MiB; fairq's own prompt bound
    # (1,000,000 characters) answers, not Envoy's 413.
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 1_500_000}]}
    status, _, doc = await post(stack.url + CHAT_URL, big)
    assert status == 400, doc
    assert doc["error"]["type"] == "invalid_request_error"
