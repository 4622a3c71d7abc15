"""What the HTTP door answers: a non-streamed answer is bounded (the backend request aborted
beyond the bound), and text generated before a backend fails reaches the caller."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import replace

import aiohttp
import grpc
import openai
import pytest
from aiohttp import web

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_server.app import FairqServer
from fairq_server.config.schema import BackendConfig, HttpConfig
from fairq_sim import SimServer

from ..conftest import FairqFactory, make_config
from ..scripted_http import serve
from .conftest import start_door
from .test_door import CHAT, assert_openai_error, post, until


async def test_an_oversized_non_streamed_answer_is_refused_and_aborted(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    door = await start_door(fairq_factory, sim, max_answer_chars=3000)
    url = f"{door.url}/v1/chat/completions"
    status, _, doc = await post(url, CHAT)  # a short answer is within the bound
    assert status == 200 and doc["choices"][0]["message"]["content"]
    sim.config.speed = 0.5  # 500 tokens take far longer than the test
    status, _, doc = await post(url, {**CHAT, "max_tokens": 500})
    assert status == 400
    assert_openai_error(doc, "invalid_request_error", "larger than 3000 characters")
    assert doc["error"]["code"] == "answer_too_large"
    await until(lambda: sim.engine.running_count == 0)


async def test_request_id_follows_the_grpc_rule_and_comes_back_as_a_header(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    door = await start_door(fairq_factory, sim)
    url = f"{door.url}/v1/chat/completions"
    for bad in ("a\nb", 'a"b', "a\u2028b", "", "x" * 129, 7):
        status, _, doc = await post(url, {**CHAT, "request_id": bad})
        assert status == 400, bad
        assert "request_id" in doc["error"]["message"], doc
    status, headers, doc = await post(url, {**CHAT, "request_id": "job-1:a/b"})
    assert status == 200 and headers["X-Request-ID"] == "job-1:a/b"
    status, headers, _ = await post(url, {**CHAT, "stream": True})
    assert status == 200 and len(headers["X-Request-ID"]) == 32  # fairq's own id


def _chunk(text: str) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    doc = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "sim",
           "choices": [choice]}  # fmt: skip
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


@contextlib.asynccontextmanager
async def cutting_backend(sim: SimServer) -> AsyncIterator[str]:
    """A backend that streams three chunks and drops the connection; the rest is the sim's."""
    async with aiohttp.ClientSession() as http:

        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            if request.method == "POST":
                await request.read()
                resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
                await resp.prepare(request)
                await resp.write(_chunk("one "))
                # fairq reads the first chunk and waits out its coalescing window (20 ms)
                # before reading again: the rest and the reset arrive within it.
                await asyncio.sleep(0.005)
                await resp.write(_chunk("two ") + _chunk("three"))
                transport = request.transport
                assert transport is not None
                # A reset, as from a backend that crashed: no last chunk, no [DONE].
                sock = transport.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                transport.abort()
                raise ConnectionResetError("dropped on purpose")
            async with http.get(sim.url + request.path_qs) as upstream:
                return web.Response(
                    status=upstream.status, body=await upstream.read(),
                    content_type=upstream.content_type,
                )  # fmt: skip

        async with serve(handle) as url:
            yield url


async def start_cutting_door(sim: SimServer, fairq_factory: FairqFactory, url: str) -> FairqServer:
    config = make_config([BackendConfig("cut", "vllm", url, ("sim",))])
    return await fairq_factory(replace(config, http=HttpConfig(listen="127.0.0.1:0")))


async def test_text_before_a_cut_stream_reaches_the_http_caller_then_the_error(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    async with cutting_backend(sim) as url:
        server = await start_cutting_door(sim, fairq_factory, url)
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="x", max_retries=0
        )
        for _ in range(5):
            texts: list[str] = []
            stream = await client.chat.completions.create(
                model="sim", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            with pytest.raises(openai.APIError):
                async for chunk in stream:
                    texts.append(chunk.choices[0].delta.content or "")
            assert texts == ["one ", "two ", "three"]


async def test_text_before_a_cut_stream_reaches_the_grpc_caller_then_the_error(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    async with cutting_backend(sim) as url:
        server = await start_cutting_door(sim, fairq_factory, url)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            for _ in range(5):
                texts: list[str] = []
                call = stub.Generate(
                    scheduler_pb2.GenerateRequest(model="sim", prompt="hi"), timeout=10
                )
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    async for response in call:
                        if response.WhichOneof("event") == "chunk":
                            texts.append(response.chunk.text)
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "".join(texts) == "one two three"
