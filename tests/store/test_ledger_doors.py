"""Every finished, failed or cancelled request through either door becomes one ledger row,
on SQLite and on a real PostgreSQL."""

from __future__ import annotations

import asyncio

import aiohttp
import grpc
import pytest

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_sim import SimServer

from ..conftest import FairqFactory, freeze_gate, sim_backend
from .helpers import read_rows, store_config, until

CHAT = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}


def generate(request_id: str) -> scheduler_pb2.GenerateRequest:
    return scheduler_pb2.GenerateRequest(
        model="sim", prompt="Hello there", request_id=request_id,
        sampling=scheduler_pb2.SamplingParams(max_tokens=6),
    )  # fmt: skip


async def test_rows_for_every_outcome_on_both_doors(
    sim: SimServer, fairq_factory: FairqFactory, store_url: str
) -> None:
    server = await fairq_factory(store_config(store_url, [sim_backend(sim)], queue_ttl_seconds=1.0))
    http = f"http://127.0.0.1:{server.http_port}/v1/chat/completions"
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
        aiohttp.ClientSession() as session,
    ):
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        done = [
            r async for r in stub.Generate(generate("g-1"), metadata=(("x-fairq-user", "gina"),))
        ]
        assert done[-1].WhichOneof("event") == "finished"
        async with session.post(http, json=CHAT, headers={"x-fairq-user": "hugo"}) as resp:
            assert resp.status == 200
            answer = await resp.json()

        await freeze_gate(server)  # from here on requests stay queued
        queue = server.core.dispatcher.queue("sim")
        # Failed: the queue's time limit passes.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            _ = [
                r
                async for r in stub.Generate(generate("g-2"), metadata=(("x-fairq-user", "gina"),))
            ]
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        async with session.post(http, json=CHAT, headers={"x-fairq-user": "hugo"}) as resp:
            assert resp.status == 504
        # Cancelled: the caller leaves while queued.
        call = stub.Generate(generate("g-3"), metadata=(("x-fairq-user", "gina"),))
        assert (await call.read()).WhichOneof("event") == "queued"
        call.cancel()
        await until(lambda: len(queue) == 0)

        async def leave() -> None:
            async with session.post(http, json=CHAT, headers={"x-fairq-user": "hugo"}):
                pass

        task = asyncio.create_task(leave())
        await until(lambda: len(queue) == 1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await until(lambda: len(queue) == 0)

    assert server.store is not None
    await server.store.ledger.flush()
    rows = await read_rows(store_url)
    summary = sorted((r["user_name"], r["outcome"]) for r in rows)
    assert summary == [
        ("gina", "cancelled"), ("gina", "deadline_exceeded"), ("gina", "finished"),
        ("hugo", "cancelled"), ("hugo", "deadline_exceeded"), ("hugo", "finished"),
    ]  # fmt: skip
    finished = {r["user_name"]: r for r in rows if r["outcome"] == "finished"}
    grpc_usage = done[-1].finished.usage
    g = finished["gina"]
    assert (g["request_id"], g["model"], g["backend"], g["tier"]) == (
        "g-1",
        "sim",
        "sim-a",
        "interactive",
    )
    assert (g["input_tokens"], g["output_tokens"]) == (
        grpc_usage.prompt_tokens,
        grpc_usage.completion_tokens,
    )
    assert g["output_tokens"] > 0 and g["team"] is None
    assert g["cost"] == pytest.approx((g["input_tokens"] * 2.0 + g["output_tokens"] * 10.0) / 1e6)
    assert g["queue_seconds"] is not None and g["ttft_seconds"] is not None
    assert g["ttft_seconds"] >= g["queue_seconds"]
    h = finished["hugo"]
    assert h["output_tokens"] == answer["usage"]["completion_tokens"]
    assert h["input_tokens"] == answer["usage"]["prompt_tokens"]
    for r in rows:
        if r["outcome"] != "finished":  # never dispatched: no backend, no tokens, no TTFT
            assert (r["backend"], r["output_tokens"], r["ttft_seconds"], r["queue_seconds"]) == (
                "",
                0,
                None,
                None,
            )
            assert r["cost"] == 0.0
