"""Fidelity with clients nobody here wrote: openai, huggingface_hub, text-generation."""

from __future__ import annotations

import asyncio

import openai
import pytest
import text_generation
from huggingface_hub import InferenceClient
from huggingface_hub.errors import OverloadedError, ValidationError
from text_generation.types import FinishReason

from fairq_sim import SimConfig, SimServer, ThreadedSimServer

from .helpers import wait_until

# text-generation 0.7 calls pydantic's deprecated .dict(); not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:The `dict` method is deprecated")

VLLM = SimConfig(mode="vllm", model="sim", speed=50.0)
TGI = SimConfig(mode="tgi", model="sim", speed=50.0)


def openai_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sim", max_retries=0)


async def test_openai_streaming_completion_with_priority_and_usage() -> None:
    async with SimServer(VLLM) as sim:
        client = openai_client(sim.url)
        stream = await client.completions.create(
            model="sim",
            prompt="Hello",
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"priority": 3},
        )
        chunks = [chunk async for chunk in stream]
        await client.close()
    with_choices = [c for c in chunks if c.choices]
    assert len(with_choices) == 5
    assert [c.choices[0].finish_reason for c in with_choices][-1] == "length"
    assert "".join(c.choices[0].text for c in with_choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    assert chunks[-1].usage.prompt_tokens == 3


async def test_openai_streaming_chat_and_plain_chat() -> None:
    config = SimConfig(model="sim", speed=50.0, priority_mode=True)
    async with SimServer(config) as sim:
        client = openai_client(sim.url)
        stream = await client.chat.completions.create(
            model="sim",
            messages=[{"role": "user", "content": "Say hi"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"priority": -2},
        )
        chunks = [chunk async for chunk in stream]
        plain = await client.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "Hi"}], max_completion_tokens=3
        )
        models = await client.models.list()
        await client.close()
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    content = [c.choices[0].delta.content for c in chunks[1:] if c.choices]
    assert len(content) == 4 and all(content)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert plain.choices[0].message.content and plain.usage is not None
    assert plain.usage.completion_tokens == 3 and plain.choices[0].finish_reason == "length"
    assert [m.id for m in models.data] == ["sim"]


async def test_openai_errors_are_typed() -> None:
    async with SimServer(VLLM) as sim:
        client = openai_client(sim.url)
        with pytest.raises(openai.NotFoundError) as missing:
            await client.completions.create(model="nope", prompt="x", max_tokens=1)
        with pytest.raises(openai.BadRequestError) as too_long:
            await client.completions.create(model="sim", prompt="x", max_tokens=100_000)
        await client.close()
    assert "does not exist" in missing.value.message
    assert "cannot be greater than max_model_len=512" in too_long.value.message


async def test_openai_sees_a_dropped_stream_as_an_error() -> None:
    config = SimConfig(model="sim", speed=50.0, drop_after_tokens=2)
    async with SimServer(config) as sim:
        client = openai_client(sim.url)
        stream = await client.completions.create(model="sim", prompt="x", max_tokens=8, stream=True)
        received = []
        with pytest.raises(openai.APIConnectionError):  # the body ended mid-stream
            async for chunk in stream:
                received.append(chunk)
        await client.close()
    assert len(received) == 2


def test_huggingface_hub_inference_client_against_tgi() -> None:
    with ThreadedSimServer(TGI) as sim:
        client = InferenceClient(model=sim.url)
        tokens = list(client.text_generation("Hello", max_new_tokens=5, stream=True))
        detailed = list(
            client.text_generation("Hello", max_new_tokens=4, stream=True, details=True)
        )
        text = client.text_generation("Hello", max_new_tokens=3)
        chat = list(
            client.chat_completion(
                messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True
            )
        )
        with pytest.raises(ValidationError):
            list(client.text_generation("Hello", max_new_tokens=600, stream=True))
    assert len(tokens) == 5 and all(isinstance(t, str) for t in tokens)
    assert [d.index for d in detailed] == [1, 2, 3, 4]
    assert detailed[-1].details is not None and detailed[-1].details.finish_reason == "length"
    # huggingface_hub leaves return_full_text unset and TGI's "/" then prepends the prompt.
    assert detailed[-1].generated_text == "Hello" + "".join(d.token.text for d in detailed)
    assert isinstance(text, str) and text.startswith("Hello")
    assert [c.choices[0].delta.role for c in chat] == ["assistant"] * 4
    assert chat[-1].choices[0].finish_reason == "length"


async def test_huggingface_hub_chat_via_base_url_and_overload() -> None:
    config = SimConfig(mode="tgi", speed=1.0, max_concurrent_requests=1)
    async with SimServer(config) as sim:
        client = InferenceClient(base_url=sim.url)

        def hold_one_and_try_another() -> None:
            holder = client.text_generation("Hi", max_new_tokens=300, stream=True)
            next(iter(holder))
            with pytest.raises(OverloadedError):
                list(client.text_generation("Hi", max_new_tokens=2, stream=True))
            for _ in holder:
                pass

        await asyncio.to_thread(hold_one_and_try_another)
        await wait_until(lambda: sim.state.in_flight == 0)


async def test_text_generation_async_client() -> None:
    async with SimServer(TGI) as sim:
        client = text_generation.AsyncClient(sim.url)
        response = await client.generate("Hello", max_new_tokens=5)
        streamed = [r async for r in client.generate_stream("Hello", max_new_tokens=4)]
        with pytest.raises(text_generation.errors.ValidationError):
            await client.generate("Hello", max_new_tokens=600)
    assert response.details.finish_reason == FinishReason.Length
    assert response.details.generated_tokens == 5 and len(response.details.tokens) == 5
    assert response.generated_text == "".join(t.text for t in response.details.tokens)
    assert [r.generated_text for r in streamed[:-1]] == [None] * 3
    assert streamed[-1].details is not None
    assert streamed[-1].details.finish_reason == FinishReason.Length
    assert streamed[-1].generated_text == "".join(r.token.text for r in streamed)


async def test_text_generation_client_parses_eos_and_stop_sequence() -> None:
    config = SimConfig(mode="tgi", speed=50.0, eos_mean_tokens=1.0)
    async with SimServer(config) as sim:
        client = text_generation.AsyncClient(sim.url)
        eos = await client.generate("Hello", max_new_tokens=5)
        eos_stream = [r async for r in client.generate_stream("Hello", max_new_tokens=5)]
    assert eos.details.finish_reason == FinishReason.EndOfSequenceToken
    assert eos_stream[-1].token.special and eos_stream[-1].token.text == "</s>"
    async with SimServer(TGI) as sim:
        client = text_generation.AsyncClient(sim.url)
        probe = await client.generate("Hello", max_new_tokens=6, seed=9)
        stop = probe.generated_text[-2:]
        stopped = await client.generate("Hello", max_new_tokens=6, seed=9, stop_sequences=[stop])
    assert stopped.details.finish_reason == FinishReason.StopSequence
