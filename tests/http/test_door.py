"""The HTTP door's behaviour: identity, errors, queue caps and timeouts, cancellation, one queue
shared with gRPC, queue-position comments, backend errors passed on."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import aiohttp
import grpc
import openai
import pytest

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_server.config.schema import BackendConfig, HttpConfig
from fairq_sim import SimServer

from ..conftest import FairqFactory, freeze_gate, make_config, sim_backend
from .conftest import Door, start_door

CHAT = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def post(
    url: str, body: object, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers=headers or {}) as resp,
    ):
        raw = await resp.read()
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = raw.decode()
        return resp.status, dict(resp.headers), doc


def assert_openai_error(doc: Any, type_: str, needle: str) -> None:
    assert set(doc) == {"error"}, doc
    assert set(doc["error"]) == {"message", "type", "param", "code"}
    assert doc["error"]["type"] == type_
    assert needle in doc["error"]["message"], doc


async def until(predicate: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        # Polling another server's state with a deadline: there is no event to await.
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_keys_tiers_and_models(keyed_door: Door) -> None:
    url = f"{keyed_door.url}/v1/chat/completions"
    status, _, doc = await post(url, CHAT)
    assert status == 401
    assert_openai_error(doc, "authentication_error", "missing 'authorization")
    status, _, doc = await post(url, CHAT, {"authorization": "Bearer wrong"})
    assert (status, doc["error"]["code"]) == (401, "invalid_api_key")
    alice = {"authorization": "Bearer alice-key"}
    status, _, doc = await post(url, CHAT, {**alice, "x-fairq-tier": "interactive"})
    assert status == 403
    assert_openai_error(doc, "permission_error", "above the ceiling")
    status, _, doc = await post(url, CHAT, {**alice, "x-fairq-tier": "gold"})
    assert status == 400
    assert_openai_error(doc, "invalid_request_error", "unknown tier")
    status, _, doc = await post(url, {**CHAT, "model": "gpt-9"}, alice)
    assert status == 404
    assert doc["error"]["code"] == "model_not_found"
    status, _, doc = await post(url, CHAT, {**alice, "x-fairq-tier": "batch"})
    assert status == 200 and doc["usage"]["completion_tokens"] == 4
    # The SDK sees the same errors as its own exception types.
    client = openai.AsyncOpenAI(base_url=f"{keyed_door.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await client.models.list()
    client = openai.AsyncOpenAI(base_url=f"{keyed_door.url}/v1", api_key="bob-key", max_retries=0)
    assert [m.id for m in (await client.models.list()).data] == ["sim"]
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "x"}]
        )
    await client.close()


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({**CHAT, "max_tokens": "ten"}, 400, "max_tokens must be an integer"),
        ({**CHAT, "max_tokens": 10**9}, 400, "max_tokens must be between 1"),
        ({**CHAT, "messages": "hi"}, 400, "messages must be a list"),
        ({**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, 400, "role 'wizard'"),
        ({**CHAT, "temperature": 9}, 400, "temperature must be in [0, 2]"),
        ({**CHAT, "stream": "yes"}, 400, "stream must be true or false"),
        ({**CHAT, "priority": -5}, 400, "priority is set by fairq"),
        ({**CHAT, "model": 3}, 400, "model is required"),
        ({"model": "sim", "prompt": "x"}, 400, "prompt belongs to /v1/completions"),
        ([1, 2], 400, "must be a JSON object"),
        ({**CHAT, "logit_bias": {"1": "x" * 300_000}}, 400, "the limit is 262144"),
    ],
)
async def test_bad_bodies(door: Door, body: object, status: int, needle: str) -> None:
    got, _, doc = await post(f"{door.url}/v1/chat/completions", body)
    assert got == status
    assert_openai_error(doc, "invalid_request_error", needle)


async def test_malformed_huge_slow_and_unrouted_requests(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    door = await start_door(fairq_factory, sim, body_timeout_seconds=0.5)
    server = door.server
    # The body bound applies live: set it as a reload would.
    await server.reload(
        replace(server.config, limits=replace(server.config.limits, max_body_bytes=10_000))
    )
    url = f"{door.url}/v1/chat/completions"
    async with aiohttp.ClientSession() as session:
        async with session.post(url, data=b'{"model": "sim", "messages": [') as resp:
            assert resp.status == 400
            assert_openai_error(await resp.json(), "invalid_request_error", "not valid JSON")
        async with session.post(url, data=b"[" * 100_000) as resp:
            assert resp.status == 413
        deep = b"[" * 5000 + b"]" * 5000
        async with session.post(url, data=deep[:9000]) as resp:
            assert resp.status == 400
        nested = ("[" * 3000 + "]" * 3000).encode()
        limits = replace(server.config.limits, max_body_bytes=100_000)
        await server.reload(replace(server.config, limits=limits))
        async with session.post(url, data=nested) as resp:
            assert resp.status == 400
            assert "nested too deeply" in (await resp.json())["error"]["message"]

        async def chunked() -> Any:
            for _ in range(20):
                yield b" " * 1000

        async with session.post(url, data=chunked()) as resp:  # no content-length
            assert resp.status == 400  # all blanks: not JSON, but within the size limit
        async with session.get(f"{door.url}/v1/nothing") as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["type"] == "invalid_request_error"
        async with session.get(url) as resp:
            assert resp.status == 405
            assert "error" in await resp.json()

    # Slowloris: a body trickling in is cut off after body_timeout_seconds with 408, and a
    # normal request is served meanwhile.
    host, port = "127.0.0.1", server.http_port
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 500\r\n\r\n{"
    )
    await writer.drain()
    status, _, doc = await post(url, CHAT)
    assert status == 200 and doc["choices"][0]["message"]["content"]
    async with asyncio.timeout(10):
        for _ in range(3):
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.1)  # trickling the body: the behaviour under test
        head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    writer.close()


async def test_queue_cap_429_with_retry_after_and_shared_with_grpc(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    config = make_config([sim_backend(sim)], max_queued_per_user=2)
    config = replace(config, http=HttpConfig(listen="127.0.0.1:0", retry_after_seconds=3))
    server = await fairq_factory(config)
    await freeze_gate(server)
    url = f"http://127.0.0.1:{server.http_port}/v1/chat/completions"
    carol = {"x-fairq-user": "carol"}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        grpc_call = stub.Generate(
            scheduler_pb2.GenerateRequest(model="sim", prompt="x"),
            metadata=(("x-fairq-user", "carol"),),
        )
        first = await grpc_call.read()
        assert first.WhichOneof("event") == "queued"
        http_task = asyncio.create_task(post(url, CHAT, carol))
        queue = server.core.dispatcher.queue("sim")
        await until(lambda: queue.user_len("carol") == 2)
        # carol's third request, through either door, hits the one per-user cap.
        status, headers, doc = await post(url, CHAT, carol)
        assert status == 429 and headers["Retry-After"] == "3"
        assert doc["error"]["code"] == "queue_full"
        # One type for every 429, a quota's (tests/http/test_quotas_http.py) as a queue's.
        assert doc["error"]["type"] == "rate_limit_exceeded"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Generate(
                scheduler_pb2.GenerateRequest(model="sim", prompt="x"),
                metadata=(("x-fairq-user", "carol"),),
            ).read()
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Another user is not affected.
        other = asyncio.create_task(post(url, CHAT, {"x-fairq-user": "dave"}))
        await until(lambda: queue.user_len("dave") == 1)
        grpc_call.cancel()
        http_task.cancel()
        other.cancel()
        await asyncio.gather(http_task, other, return_exceptions=True)
    await until(lambda: len(queue) == 0)


async def test_queue_timeout_504_and_no_backend_503(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    config = make_config([sim_backend(sim)], queue_ttl_seconds=0.2)
    config = replace(config, http=HttpConfig(listen="127.0.0.1:0"))
    server = await fairq_factory(config)
    await freeze_gate(server)
    url = f"http://127.0.0.1:{server.http_port}/v1/chat/completions"
    status, _, doc = await post(url, CHAT)
    assert status == 504 and doc["error"]["code"] == "queue_timeout"
    status, _, doc = await post(url, {**CHAT, "stream": True})
    assert status == 504  # a stream that never started still gets its status

    dead = BackendConfig("dead", "vllm", "http://127.0.0.1:9", ("sim",))
    server2 = await fairq_factory(
        replace(make_config([dead]), http=HttpConfig(listen="127.0.0.1:0"))
    )
    url2 = f"http://127.0.0.1:{server2.http_port}/v1/chat/completions"
    status, headers, doc = await post(url2, CHAT)
    assert status == 503 and "Retry-After" in headers
    assert "no healthy backend" in doc["error"]["message"]


async def test_disconnect_cancels_queued_and_running_requests(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    door = await start_door(fairq_factory, sim)
    server = door.server
    entry = server.core.backend("sim-a")
    assert entry is not None
    url = f"{door.url}/v1/chat/completions"
    # Running: the backend request is aborted when the client goes away mid-stream.
    sim.config.speed = 0.2
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json={**CHAT, "max_tokens": 400, "stream": True}) as resp,
    ):
        assert resp.status == 200
        await resp.content.readuntil(b"\n\n")
        assert sim.engine.running_count == 1
    await until(lambda: sim.engine.running_count == 0)
    async with asyncio.timeout(5):
        await entry.idle.wait()
    assert entry.in_flight == 0
    # Queued: the ticket leaves the queue.
    await freeze_gate(server)
    queue = server.core.dispatcher.queue("sim")
    task = asyncio.create_task(post(url, CHAT))
    await until(lambda: len(queue) == 1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await until(lambda: len(queue) == 0)


async def test_queue_position_comments(sim: SimServer, fairq_factory: FairqFactory) -> None:
    door = await start_door(fairq_factory, sim)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{door.url}/v1/chat/completions",
            json={**CHAT, "stream": True},
            headers={"x-fairq-queue-events": "true"},
        ) as resp,
    ):
        body = (await resp.read()).decode()
    assert body.startswith(": fairq queued position=0\n\n: fairq started backend=sim-a")
    assert body.endswith("data: [DONE]\n\n")
    # And the SDK ignores them.
    client = openai.AsyncOpenAI(base_url=f"{door.url}/v1", api_key="x", max_retries=0)
    stream = await client.chat.completions.create(
        **CHAT, stream=True, extra_headers={"x-fairq-queue-events": "1"}
    )
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    await client.close()


async def test_backend_errors_passed_on(sim: SimServer, fairq_factory: FairqFactory) -> None:
    door = await start_door(fairq_factory, sim)
    url = f"{door.url}/v1/chat/completions"
    # Refused by the backend before streaming: its status and its own error body.
    status, _, doc = await post(url, {**CHAT, "max_tokens": 1000})
    assert status == 400
    assert doc["error"]["message"].startswith("max_tokens=1000 cannot be greater than")
    # Failing mid-stream: the stream ends with an error event the SDK raises.
    sim.config.drop_after_tokens = 2
    client = openai.AsyncOpenAI(base_url=f"{door.url}/v1", api_key="x", max_retries=0)
    stream = await client.chat.completions.create(**{**CHAT, "max_tokens": 20}, stream=True)
    with pytest.raises(openai.APIError, match="backend sim-a"):
        async for _ in stream:
            pass
    await client.close()
    sim.config.drop_after_tokens = None
    status, _, doc = await post(url, CHAT)
    assert status == 200  # nothing else disturbed


async def test_open_mode_user_from_body(door: Door) -> None:
    await freeze_gate(door.server)
    queue = door.server.core.dispatcher.queue("sim")
    url = f"{door.url}/v1/chat/completions"
    task = asyncio.create_task(post(url, {**CHAT, "user": "erin"}))
    await until(lambda: queue.user_len("erin") == 1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
