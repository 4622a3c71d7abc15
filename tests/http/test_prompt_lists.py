"""A list of prompts and token-id prompts on /v1/completions, with the official openai SDK.

fairq schedules each prompt of a list as its own request and joins the answers; the
simulator answers a list as vLLM does, so the same request directly and through fairq must
give the same choices.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import aiohttp
import openai
import pytest

from fairq_server.config.schema import BackendConfig, HttpConfig, RequestBounds
from fairq_sim import SimServer

from ..conftest import FairqFactory, make_config, sim_backend
from .conftest import Door
from .test_door import assert_openai_error, post, until

PROMPTS = ["Tell me about fair queueing.", "What is a token bucket?", "Why batch requests?"]
# What LangChain's completions model sends for llm.batch([...]) (its default parameters).
LANGCHAIN = {"temperature": 0.7, "top_p": 1, "frequency_penalty": 0, "presence_penalty": 0,
             "n": 1, "logit_bias": {}, "max_tokens": 9, "seed": 11}  # fmt: skip


async def start(
    fairq_factory: FairqFactory, sim: SimServer, *backends: BackendConfig, **limits: Any
) -> Door:
    config = make_config(backends or [sim_backend(sim)])
    config = replace(config, http=HttpConfig(listen="127.0.0.1:0"), limits=RequestBounds(**limits))
    server = await fairq_factory(config)
    return Door(server, sim)


def clients(door: Door) -> tuple[openai.AsyncOpenAI, openai.AsyncOpenAI]:
    via = openai.AsyncOpenAI(base_url=f"{door.url}/v1", api_key="unused", max_retries=0)
    direct = openai.AsyncOpenAI(base_url=f"{door.sim.url}/v1", api_key="unused", max_retries=0)
    return via, direct


def outcomes(door: Door, outcome: str) -> float:
    """Return how many requests ended with ``outcome``, over every tier."""
    return sum(
        sample.value
        for metric in door.server.core.telemetry.registry.collect()
        for sample in metric.samples
        if sample.name == "fairq_requests_total" and sample.labels.get("outcome") == outcome
    )


@pytest.mark.parametrize("prompt", [PROMPTS, [[1, 2, 3, 4], [9, 8, 7], "text among ids"]])
async def test_a_list_answers_as_vllm_does_each_prompt_its_own_request(
    sim: SimServer, fairq_factory: FairqFactory, prompt: list[Any]
) -> None:
    door = await start(fairq_factory, sim)
    via, direct = clients(door)
    before = outcomes(door, "finished")
    a = await via.completions.create(model="sim", prompt=prompt, **LANGCHAIN)  # type: ignore[arg-type]
    b = await direct.completions.create(model="sim", prompt=prompt, **LANGCHAIN)  # type: ignore[arg-type]
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert all(c.text for c in a.choices)
    assert [c.finish_reason for c in a.choices] == [c.finish_reason for c in b.choices]
    assert a.usage is not None and b.usage is not None
    assert (a.usage.prompt_tokens, a.usage.completion_tokens, a.usage.total_tokens) == (
        b.usage.prompt_tokens, b.usage.completion_tokens, b.usage.total_tokens
    )  # fmt: skip
    # Each prompt went through fairq's queue as its own request.
    assert outcomes(door, "finished") - before == 3
    await via.close()
    await direct.close()


async def test_a_streamed_list_carries_each_choice_index_and_one_done(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    door = await start(fairq_factory, sim)
    body = {"model": "sim", "prompt": PROMPTS, **LANGCHAIN, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip

    async def events(url: str) -> list[Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/v1/completions", json=body) as resp,
        ):
            assert resp.status == 200
            text = (await resp.read()).decode()
        frames = [f[6:] for f in text.split("\n\n") if f.startswith("data: ")]
        return [f if f == "[DONE]" else json.loads(f) for f in frames]

    via, direct = await events(door.url), await events(sim.url)
    for got in (via, direct):
        assert got[-1] == "[DONE]" and got.count("[DONE]") == 1
        assert got[-2]["choices"] == [] and len({c["id"] for c in got[:-1]}) == 1

    def texts(chunks: list[Any]) -> list[str]:
        out = ["", "", ""]
        for chunk in chunks[:-2]:
            for choice in chunk["choices"]:
                out[choice["index"]] += choice["text"]
        return out

    assert texts(via) == texts(direct) and all(texts(via))
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [via[-2]["usage"][k] for k in counts] == [direct[-2]["usage"][k] for k in counts]
    # Without include_usage there is no usage chunk, as from OpenAI.
    client, _ = clients(door)
    stream = await client.completions.create(model="sim", prompt=PROMPTS, max_tokens=3, stream=True)
    chunks = [c async for c in stream]
    assert all(c.usage is None for c in chunks) and {c.choices[0].index for c in chunks} == {
        0,
        1,
        2,
    }
    await client.close()


async def test_token_id_prompt_same_as_direct(sim: SimServer, fairq_factory: FairqFactory) -> None:
    door = await start(fairq_factory, sim)
    via, direct = clients(door)
    kw: dict[str, Any] = {
        "model": "sim",
        "prompt": [101, 2023, 2003, 1037],
        "max_tokens": 8,
        "seed": 4,
    }
    a = await via.completions.create(**kw)
    b = await direct.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text and a.choices[0].text
    assert a.usage is not None and a.usage.prompt_tokens == 4
    await via.close()
    await direct.close()


async def test_token_ids_refused_at_admission_for_a_model_served_by_tgi(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    tgi = BackendConfig("tgi-a", "tgi", sim.url, ("sim",))
    door = await start(fairq_factory, sim, tgi)
    status, _, doc = await post(f"{door.url}/v1/completions", {"model": "sim", "prompt": [1, 2, 3]})
    assert status == 400
    assert_openai_error(doc, "invalid_request_error", "this model's backends do not take token-id")
    assert "(tgi)" in doc["error"]["message"]
    # In a list too.
    body = {"model": "sim", "prompt": ["text", [1, 2, 3]], "max_tokens": 2}
    status, _, doc = await post(f"{door.url}/v1/completions", body)
    assert status == 400
    assert_openai_error(doc, "invalid_request_error", "this model's backends do not take token-id")


async def test_the_bounds_of_a_list(sim: SimServer, fairq_factory: FairqFactory) -> None:
    door = await start(fairq_factory, sim, max_prompts=4, max_prompt_chars=100)
    url = f"{door.url}/v1/completions"
    status, _, doc = await post(url, {"model": "sim", "prompt": ["a"] * 5})
    assert status == 400
    assert_openai_error(doc, "invalid_request_error", "a list of 5 prompts; the limit is 4")
    status, _, doc = await post(url, {"model": "sim", "prompt": ["a", "b" * 101]})
    assert status == 400
    assert_openai_error(doc, "invalid_request_error", "prompt[1] has 101 characters")
    status, _, doc = await post(url, {"model": "sim", "prompt": [[1] * 26]})
    assert status == 400
    assert_openai_error(doc, "invalid_request_error", "26 token ids; the limit is 25")
    status, _, doc = await post(url, {"model": "sim", "prompt": [[1, 2**31]]})
    assert status == 400
    assert_openai_error(doc, "invalid_request_error", "prompt[0][1] must be a token id")
    status, _, doc = await post(url, {"model": "sim", "prompt": ["a"] * 4, "max_tokens": 2})
    assert status == 200 and [c["index"] for c in doc["choices"]] == [0, 1, 2, 3]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_failing_prompt_fails_the_list_and_cancels_the_others(
    sim: SimServer, fairq_factory: FairqFactory, stream: bool
) -> None:
    door = await start(fairq_factory, sim)
    sim.config.speed = 0.5  # the good prompts' 500 tokens take far longer than the test
    # A prompt longer than the engine's context: it refuses that one before any token.
    too_long = [1] * (sim.state.profile.max_model_len + 1)
    body = {"model": "sim", "prompt": ["a fine prompt", too_long, "another"], "max_tokens": 500,
            "stream": stream}  # fmt: skip
    before = outcomes(door, "cancelled")
    status, _, doc = await post(f"{door.url}/v1/completions", body)
    if isinstance(doc, dict):
        assert status == 400
        assert "maximum context length" in doc["error"]["message"], doc
    else:  # the stream had begun with the good prompts' text: the error ends it
        assert status == 200
        assert '"error"' in doc and "maximum context length" in doc and "[DONE]" not in doc
    # No half answer: the other prompts were cancelled and their engine requests aborted.
    await until(lambda: sim.engine.running_count == 0)
    assert outcomes(door, "cancelled") - before == 2


async def test_a_caller_leaving_a_streamed_list_cancels_every_prompt(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    door = await start(fairq_factory, sim)
    sim.config.speed = 0.5  # 500 tokens take far longer than the test
    body = {"model": "sim", "prompt": PROMPTS, "max_tokens": 500, "stream": True}
    before = outcomes(door, "cancelled")
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{door.url}/v1/completions", json=body) as resp,
    ):
        assert resp.status == 200
        assert (await resp.content.readline()).startswith(b"data: ")
        await until(lambda: sim.engine.running_count == 3)
    # The connection is closed: fairq cancels all three and aborts their engine requests.
    await until(lambda: sim.engine.running_count == 0)
    await until(lambda: outcomes(door, "cancelled") - before == 3)
