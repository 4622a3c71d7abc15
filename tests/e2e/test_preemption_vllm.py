"""Preemption by continuation on a real vLLM: greedy output is exactly the unpreempted one.

A power request (temperature 0) is preempted three times by light requests of a higher tier;
each continuation sends vLLM the prompt's and the output's token ids, so the text its caller
reads must equal, character for character, the text of the same request never preempted —
on the gRPC door (completions and chat) and on the HTTP door (one chunk id, no token ids, the
reference's usage). fairq runs in this process (the test reads its dispatcher to time the
light requests).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import aiohttp
import grpc

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_server.app import FairqServer
from fairq_server.config.preempt import PreemptConfig
from fairq_server.config.schema import BackendConfig, HttpConfig, TierConfig

from ..conftest import FairqFactory, make_config
from .vllm_process import VllmProcess

MAX_TOKENS = 160
PREEMPTIONS = 3


async def until(predicate: Callable[[], bool], timeout: float) -> None:
    """Wait for dispatcher state that no event announces, with a deadline."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - polling the dispatcher's state
            await asyncio.sleep(0.005)


def greedy(prompt: str, max_tokens: int, *, chat: bool = False) -> scheduler_pb2.GenerateRequest:
    sampling = scheduler_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    if chat:
        return scheduler_pb2.GenerateRequest(
            model="tiny", messages=scheduler_pb2.ChatMessages(
                messages=[scheduler_pb2.ChatMessage(role="user", content=prompt)]
            ),
            sampling=sampling, tier="standard",
        )  # fmt: skip
    return scheduler_pb2.GenerateRequest(
        model="tiny", prompt=prompt, sampling=sampling, tier="standard"
    )


async def start_fairq(factory: FairqFactory, vllm: VllmProcess) -> FairqServer:
    tiers = (
        TierConfig("interactive", max_backend_waiting=0, tpot_limit_seconds=None,
                   preempt_after_seconds=0.0),
        TierConfig("standard", max_backend_waiting=0, tpot_limit_seconds=None),
    )  # fmt: skip
    # One slot as fairq counts them: every light request must take the power request's.
    backend = BackendConfig("vllm", "vllm", vllm.url, ("tiny",), max_in_flight=1, preempt=True)
    preempt = PreemptConfig(min_tokens=8, max_per_request=PREEMPTIONS, max_per_second=100)
    config = make_config([backend], preempt=preempt)
    return await factory(replace(config, tiers=tiers, http=HttpConfig(listen="127.0.0.1:0")))


async def text_of(call: object) -> tuple[str, list[scheduler_pb2.GenerateResponse]]:
    events = [e async for e in call]  # type: ignore[attr-defined]
    text = "".join(e.chunk.text for e in events if e.WhichOneof("event") == "chunk")
    return text, events


async def preempted_run(server: FairqServer, request: scheduler_pb2.GenerateRequest) -> str:
    attempts = server.core.dispatcher.attempts
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        power = asyncio.create_task(
            text_of(stub.Generate(request, metadata=(("x-fairq-user", "power"),)))
        )
        for i in range(PREEMPTIONS):
            # Wait until the power request runs again and is past the anti-thrash bound.
            def resumed(i: int = i) -> bool:
                return any(
                    t.user == "power"
                    and t.progress is not None
                    and t.progress.tokens >= 8 * (i + 2)
                    and t.progress.preemptions == i
                    and t.generating
                    for t in attempts.on_backend.get("vllm", ())
                )

            await until(resumed, 120)
            light = scheduler_pb2.GenerateRequest(
                model="tiny", prompt=f"light {i}", tier="interactive",
                sampling=scheduler_pb2.SamplingParams(max_tokens=2),
            )  # fmt: skip
            _, events = await text_of(stub.Generate(light, metadata=(("x-fairq-user", "light"),)))
            assert events[-1].WhichOneof("event") == "finished"
        text, events = await power
    names = [e.WhichOneof("event") for e in events]
    assert names.count("started") == 1 and names[-1] == "finished"
    assert events[-1].finished.usage.completion_tokens == MAX_TOKENS
    assert events[-1].finished.finish_reason == "length"
    return text


async def reference_run(server: FairqServer, request: scheduler_pb2.GenerateRequest) -> str:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        text, _ = await text_of(stub.Generate(request, metadata=(("x-fairq-user", "ref"),)))
    return text


async def test_greedy_completion_preempted_three_times_streams_the_same_text(
    vllm_fcfs: VllmProcess, fairq_factory: FairqFactory
) -> None:
    server = await start_fairq(fairq_factory, vllm_fcfs)
    request = greedy("The history of the queue begins", MAX_TOKENS)
    reference = await reference_run(server, request)
    preempted = await preempted_run(server, request)
    telemetry = server.core.telemetry
    assert telemetry.preemptions.labels("vllm", "tier")._value.get() == PREEMPTIONS
    assert preempted == reference


async def test_greedy_chat_preempted_three_times_streams_the_same_text(
    vllm_fcfs: VllmProcess, fairq_factory: FairqFactory
) -> None:
    server = await start_fairq(fairq_factory, vllm_fcfs)
    request = greedy("Tell me about fair queues", MAX_TOKENS, chat=True)
    reference = await reference_run(server, request)
    preempted = await preempted_run(server, request)
    assert preempted == reference


async def sse(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], user: str
) -> list[Any]:
    """POST ``body`` to the HTTP door; return its events (``[DONE]`` as the string)."""
    tier = "interactive" if user == "light" else "standard"
    headers = {"x-fairq-user": user, "x-fairq-tier": tier}
    events: list[Any] = []
    async with session.post(url, json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            data = line.decode().strip().removeprefix("data: ")
            if line.startswith(b"data: "):
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def streamed_text(events: list[Any]) -> str:
    choices = [c for e in events if e != "[DONE]" for c in e["choices"]]
    return "".join((c.get("delta") or {}).get("content") or c.get("text") or "" for c in choices)


async def test_http_door_preempted_stream_is_the_unpreempted_one(
    vllm_fcfs: VllmProcess, fairq_factory: FairqFactory
) -> None:
    # "The queue" makes the tiny model emit byte tokens whose text vLLM holds back: the
    # continuation must start where the text sent so far ends.
    server = await start_fairq(fairq_factory, vllm_fcfs)
    attempts = server.core.dispatcher.attempts
    url = f"http://127.0.0.1:{server.http_port}/v1/completions"
    body = {
        "model": "tiny", "prompt": "The queue", "max_tokens": 120, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    async with aiohttp.ClientSession() as session:
        reference = await sse(session, url, body, "ref")
        power = asyncio.create_task(sse(session, url, body, "power"))
        for i in range(2):

            def resumed(i: int = i) -> bool:
                return any(
                    t.user == "power" and t.progress is not None and t.generating
                    and t.progress.tokens >= 8 * (i + 2) and t.progress.preemptions == i
                    for t in attempts.on_backend.get("vllm", ())
                )  # fmt: skip

            await until(resumed, 120)
            light = {"model": "tiny", "prompt": "hi", "max_tokens": 2, "stream": True}
            await sse(session, url, light, "light")
        events = await power
    assert server.core.telemetry.preemptions.labels("vllm", "tier")._value.get() == 2
    assert streamed_text(events) == streamed_text(reference)
    chunks = [e for e in events if e != "[DONE]"]
    assert events.count("[DONE]") == 1 and len({c["id"] for c in chunks}) == 1
    assert not any(
        c.get("token_ids") or c.get("prompt_token_ids") for e in chunks for c in e["choices"]
    )
    assert [e["usage"] for e in chunks if e.get("usage")] == [
        e["usage"] for e in reference if e != "[DONE]" and e.get("usage")
    ]
