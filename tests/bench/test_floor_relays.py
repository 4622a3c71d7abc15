"""The hot path's floor relays carry a stream whole: their cost is measured on real work.

``fairq_bench.hot_path.floor`` compares fairq's doors with relays that do nothing else; a
relay that dropped or cut the stream would look cheaper than it is. Each relay here runs as
the benchmark runs it (its own process, in front of the firehose backend).
"""

from __future__ import annotations

import contextlib

import aiohttp
import grpc
import orjson

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_bench.processes import child_process

TOKENS = 50
BODY = {"model": "sim", "prompt": "hello", "stream": True, "max_tokens": TOKENS}


async def _sse_text(session: aiohttp.ClientSession, url: str) -> tuple[str, bool]:
    """The text of a streamed completion at ``url``, and whether it ended with ``[DONE]``."""
    async with session.post(f"{url}/v1/completions", json=BODY) as resp:
        assert resp.status == 200
        raw = await resp.read()
    text, done = [], False
    for event in raw.split(b"\n\n"):
        data = event.removeprefix(b"data: ")
        if data == b"[DONE]":
            done = True
        elif data:
            text.extend(c["text"] for c in orjson.loads(data)["choices"])
    return "".join(text), done


async def test_the_http_relays_forward_every_event_parsed_or_not() -> None:
    async with contextlib.AsyncExitStack() as stack:
        firehose = ["-m", "fairq_bench.scenarios.firehose", "--step-ms", "0", "--first-now"]
        _, backend = await stack.enter_async_context(child_process(firehose, r"^(http://\S+)"))
        session = await stack.enter_async_context(aiohttp.ClientSession())
        direct = await _sse_text(session, backend)
        assert direct == ("a" * TOKENS, True)
        relay = ["-m", "fairq_bench.scenarios.bare_relay", "--backend", backend, "--uvloop"]
        for extra in ([], ["--parse"]):
            _, url = await stack.enter_async_context(
                child_process([*relay, *extra], r"^(http://\S+)")
            )
            assert await _sse_text(session, url) == direct, extra


async def test_the_grpc_relay_sends_the_whole_text_then_the_finish() -> None:
    async with contextlib.AsyncExitStack() as stack:
        firehose = ["-m", "fairq_bench.scenarios.firehose", "--step-ms", "0", "--first-now"]
        _, backend = await stack.enter_async_context(child_process(firehose, r"^(http://\S+)"))
        _, target = await stack.enter_async_context(
            child_process(
                ["-m", "fairq_bench.scenarios.bare_grpc_relay", "--backend", backend],
                r"^(\S+:\d+)",
            )
        )
        async with grpc.aio.insecure_channel(target) as channel:
            request = scheduler_pb2.GenerateRequest(
                model="sim", prompt="hello",
                sampling=scheduler_pb2.SamplingParams(max_tokens=TOKENS),
            )  # fmt: skip
            replies = [r async for r in scheduler_pb2_grpc.SchedulerStub(channel).Generate(request)]
    assert "".join(r.chunk.text for r in replies[:-1]) == "a" * TOKENS
    assert replies[-1].WhichOneof("event") == "finished"
    assert replies[-1].finished.finish_reason == "length"
