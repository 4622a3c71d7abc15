"""Generate with a token-id prompt (GenerateRequest.prompt_token_ids) against the simulator."""

from __future__ import annotations

from dataclasses import replace

import grpc
import httpx
import pytest

from fairq.v1 import scheduler_pb2
from fairq_server.config.schema import BackendConfig, RequestBounds
from fairq_sim import SimServer

from ..conftest import FairqFactory, make_config, sim_backend
from .test_generate import call

IDS = [101, 2023, 2003, 1037, 7]


def request(ids: list[int], seed: int = 0) -> scheduler_pb2.GenerateRequest:
    return scheduler_pb2.GenerateRequest(
        model="sim",
        prompt_token_ids=scheduler_pb2.TokenIds(ids=ids),
        sampling=scheduler_pb2.SamplingParams(max_tokens=8, seed=seed),
    )


async def test_token_ids_reach_the_engine_as_sent(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)]))
    events = await call(server.port, request(IDS, seed=5))
    text = "".join(e.chunk.text for e in events if e.WhichOneof("event") == "chunk")
    assert events[-1].finished.usage.prompt_tokens == len(IDS)
    body = {"model": "sim", "prompt": IDS, "max_tokens": 8, "seed": 5}
    async with httpx.AsyncClient(base_url=sim.url) as client:
        direct = (await client.post("/v1/completions", json=body)).json()
    assert text == direct["choices"][0]["text"] and text


@pytest.mark.parametrize(
    ("ids", "needle"),
    [
        ([], "prompt_token_ids is empty"),
        ([1, 2**31], "below 2^31"),
        ([1] * 26, "26 ids; the limit is 25"),
    ],
)
async def test_token_ids_are_checked(
    sim: SimServer, fairq_factory: FairqFactory, ids: list[int], needle: str
) -> None:
    config = make_config([sim_backend(sim)])
    config = replace(config, limits=RequestBounds(max_prompt_chars=100))
    server = await fairq_factory(config)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(server.port, request(ids))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in (err.value.details() or "")


async def test_token_ids_refused_for_a_model_tgi_serves(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    tgi = BackendConfig("tgi-a", "tgi", sim.url, ("sim",))
    server = await fairq_factory(make_config([sim_backend(sim), tgi]))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(server.port, request(IDS))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "this model's backends do not take token-id prompts (tgi)" in (err.value.details() or "")
