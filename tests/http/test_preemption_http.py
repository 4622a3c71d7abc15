"""Preemption through the HTTP door: the victim's caller reads one unbroken OpenAI stream.

Its chunks keep one ``id``, it gets one opening role chunk (chat), one finish reason, one
usage chunk with the summed usage and one ``[DONE]``, however often the request was resumed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import aiohttp
import pytest

from fairq_server.config.preempt import PreemptConfig
from fairq_server.config.schema import DEFAULT_TIERS, HttpConfig
from fairq_sim import SimConfig, SimServer

from ..conftest import FairqFactory, make_config, sim_backend

POWER_TOKENS = 300
SLOTS = 2


async def until(predicate: Callable[[], bool], timeout: float) -> None:
    """Wait for dispatcher state that no event announces, with a deadline."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - polling the dispatcher's state
            await asyncio.sleep(0.005)


@pytest.fixture
async def slow_sim() -> AsyncIterator[SimServer]:
    async with SimServer(SimConfig(mode="vllm", model="sim", speed=2.0, max_num_seqs=SLOTS)) as s:
        yield s


def body(chat: bool, text: str, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    common: dict[str, Any] = {
        "model": "sim", "max_tokens": max_tokens, "ignore_eos": True, "stream": stream,
    }  # fmt: skip
    if stream:
        common["stream_options"] = {"include_usage": True}
    if chat:
        return {**common, "messages": [{"role": "user", "content": text}]}
    return {**common, "prompt": text}


async def sse(
    session: aiohttp.ClientSession, url: str, payload: dict[str, Any], user: str, log: list[str]
) -> list[Any]:
    events: list[Any] = []
    async with session.post(url, json=payload, headers={"x-fairq-user": user}) as resp:
        assert resp.status == 200, await resp.text()
        if not payload["stream"]:
            events.append(await resp.json())
        async for line in resp.content:
            text = line.decode().strip()
            if text.startswith("data: "):
                data = text[6:]
                events.append(data if data == "[DONE]" else json.loads(data))
    log.append(user)
    return events


async def preempted(
    chat: bool, stream: bool, sim: SimServer, fairq_factory: FairqFactory
) -> list[list[Any]]:
    """Two power requests fill the slots, a light one preempts; return the power responses."""
    tiers = tuple(
        replace(t, preempt_after_seconds=0.0, max_backend_waiting=0) for t in DEFAULT_TIERS
    )
    backend = sim_backend(sim, preempt=True, max_in_flight=SLOTS)
    config = make_config([backend], preempt=PreemptConfig(min_tokens=4, max_per_second=100))
    config = replace(config, tiers=tiers, http=HttpConfig(listen="127.0.0.1:0"))
    server = await fairq_factory(config)
    url = f"http://127.0.0.1:{server.http_port}/v1/{'chat/completions' if chat else 'completions'}"
    state = server.core.backend("sim-a")
    assert state is not None
    done: list[str] = []
    async with aiohttp.ClientSession() as session:
        power = [
            asyncio.create_task(
                sse(session, url, body(chat, f"power {i}", POWER_TOKENS, stream), "power", done)
            )
            for i in range(SLOTS)
        ]
        running = server.core.dispatcher.attempts.on_backend
        await until(
            lambda: state.in_flight == SLOTS and all(t.generating for t in running["sim-a"]), 30
        )
        await sse(session, url, body(chat, "light", 4), "light", done)
        streams = await asyncio.gather(*power)
    assert done[0] == "light"
    assert server.core.telemetry.preemptions.labels("sim-a", "fair-share")._value.get() == 1
    return streams


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
async def test_the_preempted_caller_reads_one_openai_stream(
    chat: bool, slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    streams = await preempted(chat, True, slow_sim, fairq_factory)
    for events in streams:
        assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
        chunks = events[:-1]
        assert len({c["id"] for c in chunks}) == 1  # one stream, as far as the caller can tell
        choices = [ch for c in chunks for ch in c["choices"]]
        assert [ch["finish_reason"] for ch in choices if ch.get("finish_reason")] == ["length"]
        # Token ids fairq asked for itself are not passed on (vLLM sends nulls of its own).
        assert not any(ch.get("token_ids") or ch.get("prompt_token_ids") for ch in choices)
        if chat:
            assert sum(1 for ch in choices if ch["delta"].get("role")) == 1
        usage = [c["usage"] for c in chunks if c.get("usage")]
        assert len(usage) == 1
        assert usage[0]["completion_tokens"] == POWER_TOKENS
        assert usage[0]["prompt_tokens"] + POWER_TOKENS == usage[0]["total_tokens"]


async def test_a_preempted_non_streamed_answer_is_whole(
    slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    for (answer,) in await preempted(True, False, slow_sim, fairq_factory):
        assert answer["object"] == "chat.completion"
        assert answer["choices"][0]["finish_reason"] == "length"
        assert answer["choices"][0]["message"]["content"]
        assert answer["usage"]["completion_tokens"] == POWER_TOKENS
