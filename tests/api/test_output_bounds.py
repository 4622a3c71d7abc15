"""``limits.max_tokens`` and ``limits.max_sequences`` hold on both doors, whatever the caller
leaves out or passes through under an engine's own names."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import grpc
import pytest
from google.protobuf import struct_pb2

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_server.app import FairqServer
from fairq_server.config.schema import HttpConfig, RequestBounds
from fairq_sim import SimConfig, SimServer

from ..conftest import FairqFactory, make_config, sim_backend


async def start(fairq_factory: FairqFactory, sim: SimServer, **limits: int) -> FairqServer:
    config = make_config([sim_backend(sim)])
    config = replace(config, http=HttpConfig(listen="127.0.0.1:0"), limits=RequestBounds(**limits))
    return await fairq_factory(config)


async def grpc_call(port: int, req: scheduler_pb2.GenerateRequest) -> list[Any]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        return [r async for r in stub.Generate(req)]


async def http_post(server: FairqServer, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    url = f"http://127.0.0.1:{server.http_port}{path}"
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        return resp.status, await resp.json()


def with_extra(extra: dict[str, Any], **kw: Any) -> scheduler_pb2.GenerateRequest:
    struct = struct_pb2.Struct()
    struct.update(extra)
    return scheduler_pb2.GenerateRequest(model="sim", prompt="Hello there", extra=struct, **kw)


@pytest.fixture
async def tgi() -> AsyncIterator[SimServer]:
    async with SimServer(SimConfig(mode="tgi", model="sim", speed=20.0)) as s:
        yield s


async def test_missing_max_tokens_gets_the_limit_on_both_doors(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    # Without a bound the simulator (like vLLM) generates up to the context's end (~500).
    server = await start(fairq_factory, sim, max_tokens=16)
    events = await grpc_call(server.port, scheduler_pb2.GenerateRequest(model="sim", prompt="hi"))
    assert events[-1].finished.usage.completion_tokens == 16
    chat = {"model": "sim", "messages": [{"role": "user", "content": "hi"}]}
    status, doc = await http_post(server, "/v1/chat/completions", chat)
    assert status == 200 and doc["usage"]["completion_tokens"] == 16
    status, doc = await http_post(server, "/v1/completions", {"model": "sim", "prompt": "hi"})
    assert status == 200 and doc["usage"]["completion_tokens"] == 16
    # max_completion_tokens alone is the bound, not the default.
    status, doc = await http_post(
        server, "/v1/chat/completions", {**chat, "max_completion_tokens": 5}
    )
    assert status == 200 and doc["usage"]["completion_tokens"] == 5


async def test_a_default_bound_over_the_context_is_sent_as_the_context(
    fairq_factory: FairqFactory,
) -> None:
    """vLLM refuses a max_tokens above max_model_len: with limits.max_tokens (32768) over a
    model's context, every caller that left the bound out got a 400. The bound fairq chose is
    sent at most the context /v1/models gave, so such a caller gets the rest of the context,
    as from vLLM directly; a bound the caller gave is still vLLM's to refuse."""
    config = SimConfig(mode="vllm", model="sim", speed=20.0, max_model_len=48)
    async with SimServer(config) as sim:
        server = await start(fairq_factory, sim)
        events = await grpc_call(
            server.port, scheduler_pb2.GenerateRequest(model="sim", prompt="hi")
        )
        usage = events[-1].finished.usage
        assert usage.prompt_tokens + usage.completion_tokens == 48
        chat = {"model": "sim", "messages": [{"role": "user", "content": "hi"}]}
        status, doc = await http_post(server, "/v1/chat/completions", chat)
        assert status == 200, doc
        assert doc["choices"][0]["finish_reason"] == "length"
        assert doc["usage"]["prompt_tokens"] + doc["usage"]["completion_tokens"] == 48
        # Completions without a bound get the API's own default, 16 (OpenAI's and vLLM's).
        status, doc = await http_post(server, "/v1/completions", {"model": "sim", "prompt": "hi"})
        assert status == 200 and doc["usage"]["completion_tokens"] == 16, doc
        status, doc = await http_post(
            server, "/v1/completions", {"model": "sim", "prompt": "hi", "max_tokens": 100}
        )
        assert (
            status == 400 and "cannot be greater than max_model_len=48" in doc["error"]["message"]
        )
        # Read from /v1/models with the served-models check.
        assert server.core.backend("sim-a").backend.context_lengths == {"sim": 48}  # type: ignore[union-attr]


async def test_a_default_bound_over_tgis_context_is_left_to_tgi(
    fairq_factory: FairqFactory,
) -> None:
    """TGI refuses a prompt plus max_new_tokens over max_total_tokens (it does not cap): a
    bound fairq chose at least the context /info gives is left out, and TGI generates the
    rest of the context; a bound the caller gave is still TGI's to refuse."""
    config = SimConfig(mode="tgi", model="sim", speed=20.0, max_model_len=48)
    async with SimServer(config) as tgi:
        server = await start(fairq_factory, tgi)
        events = await grpc_call(
            server.port, scheduler_pb2.GenerateRequest(model="sim", prompt="hi")
        )
        usage = events[-1].finished.usage
        assert usage.prompt_tokens + usage.completion_tokens == 48
        chat = {"model": "sim", "messages": [{"role": "user", "content": "hi"}]}
        status, doc = await http_post(server, "/v1/chat/completions", chat)
        assert status == 200, doc
        assert doc["usage"]["prompt_tokens"] + doc["usage"]["completion_tokens"] == 48
        status, doc = await http_post(server, "/v1/chat/completions", {**chat, "max_tokens": 100})
        assert status == 400 and "must be <= 48" in doc["error"]["message"], doc
        assert server.core.backend("sim-a").backend.context_lengths == {"sim": 48}  # type: ignore[union-attr]
        # A limit below the context is still sent, and holds.
        server = await start(fairq_factory, tgi, max_tokens=5)
        events = await grpc_call(
            server.port, scheduler_pb2.GenerateRequest(model="sim", prompt="hi")
        )
        assert events[-1].finished.usage.completion_tokens == 5


async def test_default_max_tokens_below_the_limit(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await start(fairq_factory, sim, max_tokens=64, default_max_tokens=6)
    events = await grpc_call(server.port, scheduler_pb2.GenerateRequest(model="sim", prompt="hi"))
    assert events[-1].finished.usage.completion_tokens == 6


async def test_engine_token_names_refused(tgi: SimServer, fairq_factory: FairqFactory) -> None:
    server = await start(fairq_factory, tgi, max_tokens=16)
    for name in ("max_new_tokens", "n_predict"):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await grpc_call(server.port, with_extra({name: 400}))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"must not set {name}" in str(info.value.details())
        body = {"model": "sim", "prompt": "hi", name: 1_000_000}
        status, doc = await http_post(server, "/v1/completions", body)
        assert status == 400 and f"must not set {name}" in doc["error"]["message"]
    # OpenAI's other name is checked on the completions route too (some engines read it).
    body = {"model": "sim", "prompt": "hi", "max_completion_tokens": 1_000_000}
    status, doc = await http_post(server, "/v1/completions", body)
    assert status == 400 and "max_completion_tokens must be between 1 and 16" in str(doc)
    # What is left reaches TGI's /generate_stream bounded by the limit.
    events = await grpc_call(server.port, with_extra({"top_k": 3}))
    assert events[-1].finished.usage.completion_tokens == 16


async def test_sequences_bounded(sim: SimServer, fairq_factory: FairqFactory) -> None:
    server = await start(fairq_factory, sim)
    # Over HTTP, n is fairq's (each choice its own request) up to limits.max_choices;
    # best_of, like the gRPC door's extra, would run in one slot: limits.max_sequences.
    status, doc = await http_post(
        server, "/v1/completions", {"model": "sim", "prompt": "hi", "n": 17}
    )
    assert status == 400 and doc["error"]["message"].startswith("n is 17; the limit is 16")
    status, doc = await http_post(
        server, "/v1/completions", {"model": "sim", "prompt": "hi", "best_of": 8}
    )
    assert status == 400 and doc["error"]["message"].startswith("best_of is 8; the limit is 1")
    for key in ("n", "best_of"):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await grpc_call(server.port, with_extra({key: 2}))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"{key} is 2; the limit is 1" in str(info.value.details())
    status, doc = await http_post(
        server, "/v1/completions", {"model": "sim", "prompt": "hi", "n": "2"}
    )
    assert status == 400 and doc["error"]["message"] == "n must be a positive integer"
    # n = 1 is no more than the one sequence fairq schedules.
    status, doc = await http_post(
        server, "/v1/completions", {"model": "sim", "prompt": "hi", "n": 1, "max_tokens": 3}
    )
    assert status == 200 and doc["usage"]["completion_tokens"] == 3
