"""Load and probes for the hot-path benchmark: streams that cost the caller little.

The load generator shares a core with the backend, so its own cost per token must stay small:
the HTTP streams read bytes and never parse them, the gRPC streams use the generated stub (no
client-side event objects). Tokens are counted by the backend (``firehose_tokens_total``),
the same way for both doors; fairq relays every token of a closed-loop stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

import aiohttp
import grpc

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_bench.hot_path.setup import Door
from fairq_bench.processes import cpu_seconds
from fairq_bench.report import percentile

__all__ = [
    "Probe",
    "Rate",
    "Rounds",
    "Stream",
    "background",
    "door_probes",
    "door_streams",
    "http_probe",
    "latency_rounds",
    "measure",
]

Stream = Callable[[str, str, int], Awaitable[None]]
"""Sends one request (user, prompt, tokens) and reads it to the end."""

#: A probe slower than this is a collapse, not a measurement.
PROBE_TIMEOUT = 30.0
_TOKENS = re.compile(rb"^firehose_tokens_total (\d+)$", re.MULTILINE)


def http_stream(session: aiohttp.ClientSession, base: str) -> Stream:
    """A streamed ``/v1/completions`` whose bytes are drained, not parsed."""

    async def send(user: str, prompt: str, tokens: int) -> None:
        body = {"model": "sim", "prompt": prompt, "max_tokens": tokens, "stream": True,
                "user": user}  # fmt: skip
        async with session.post(f"{base}/v1/completions", json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.read())[:200]!r}")
            async for _ in resp.content.iter_any():
                pass

    return send


def grpc_stream(channel: grpc.aio.Channel) -> Stream:
    """A ``Scheduler/Generate`` call through the generated stub, messages dropped as read."""
    stub = scheduler_pb2_grpc.SchedulerStub(channel)

    async def send(user: str, prompt: str, tokens: int) -> None:
        request = scheduler_pb2.GenerateRequest(
            model="sim", prompt=prompt, sampling=scheduler_pb2.SamplingParams(max_tokens=tokens)
        )
        async for _ in stub.Generate(request, metadata=(("x-fairq-user", user),)):
            pass

    return send


async def backend_tokens(session: aiohttp.ClientSession, backend: str) -> int:
    """Tokens the backend has written so far."""
    async with session.get(f"{backend}/metrics") as resp:
        found = _TOKENS.search(await resp.read())
    if found is None:
        raise RuntimeError("the backend's /metrics has no firehose_tokens_total")
    return int(found.group(1))


@contextlib.asynccontextmanager
async def background(send: Stream, streams: int, tokens: int) -> AsyncIterator[None]:
    """``streams`` closed-loop streams of ``tokens`` tokens while inside."""

    async def worker(index: int) -> None:
        k = 0
        while True:
            await send(f"user-{index % 32}", f"s{index} r{k}", tokens)
            k += 1

    tasks = [asyncio.create_task(worker(i)) for i in range(streams)]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"a load stream failed: {task.exception()!r}")


@dataclass(frozen=True)
class Rate:
    """One measured window: tokens/s relayed, fairq's cores (CPU s/s), the window's length."""

    tokens_per_second: float
    fairq_cores: float
    seconds: float

    @property
    def per_core_second(self) -> float:
        """Tokens per second of fairq CPU time."""
        return self.tokens_per_second / self.fairq_cores if self.fairq_cores else 0.0


async def measure(
    session: aiohttp.ClientSession, backend: str, pids: list[int], seconds: float
) -> Rate:
    """Tokens the backend writes and the CPU the ``pids`` use over ``seconds``."""
    tokens0, t0 = await backend_tokens(session, backend), time.monotonic()
    cpu0 = sum(cpu_seconds(pid) for pid in pids)
    await asyncio.sleep(seconds)
    cpu = sum(cpu_seconds(pid) for pid in pids) - cpu0
    tokens, elapsed = await backend_tokens(session, backend) - tokens0, time.monotonic() - t0
    return Rate(tokens / elapsed, cpu / elapsed, elapsed)


Probe = Callable[[int], Awaitable[float]]
"""Sends the ``index``-th two-token probe; returns the seconds to its first token."""


def http_probe(session: aiohttp.ClientSession, base: str) -> Probe:
    """Time to the first token's event of a streamed ``/v1/completions`` (read to the end)."""

    async def send(index: int) -> float:
        async with asyncio.timeout(PROBE_TIMEOUT):
            return await _send(index)

    async def _send(index: int) -> float:
        body = {"model": "sim", "prompt": f"Short question number {index}?", "max_tokens": 2,
                "stream": True, "user": "probe"}  # fmt: skip
        started, first = time.monotonic(), 0.0
        async with session.post(f"{base}/v1/completions", json=body) as resp:
            async for chunk in resp.content.iter_any():
                if not first and b'"text":"a"' in chunk:
                    first = time.monotonic() - started
        return first or float("nan")

    return send


def grpc_probe(channel: grpc.aio.Channel) -> Probe:
    """Time to the first ``chunk`` message of a ``Generate`` call (read to the end)."""
    stub = scheduler_pb2_grpc.SchedulerStub(channel)

    async def send(index: int) -> float:
        async with asyncio.timeout(PROBE_TIMEOUT):
            return await _send(index)

    async def _send(index: int) -> float:
        request = scheduler_pb2.GenerateRequest(
            model="sim", prompt=f"Short question number {index}?",
            sampling=scheduler_pb2.SamplingParams(max_tokens=2),
        )  # fmt: skip
        started, first = time.monotonic(), 0.0
        async for event in stub.Generate(request, metadata=(("x-fairq-user", "probe"),)):
            if not first and event.WhichOneof("event") == "chunk":
                first = time.monotonic() - started
        return first or float("nan")

    return send


def door_streams(session: aiohttp.ClientSession, door: Door) -> dict[str, Stream]:
    """The two doors of ``door`` as load streams."""
    return {"grpc": grpc_stream(door.channel), "http": http_stream(session, door.http)}


def door_probes(session: aiohttp.ClientSession, door: Door) -> dict[str, Probe]:
    """The two doors of ``door`` as probes."""
    return {"grpc": grpc_probe(door.channel), "http": http_probe(session, door.http)}


Rounds = dict[str, list[tuple[float, float]]]


async def latency_rounds(paths: Mapping[str, Probe], rounds: int, per_round: int) -> Rounds:
    """Per path, each round's (p50, p99) in seconds; the paths' order rotates every probe."""
    names = list(paths)
    for name in names * 3:  # warm-up: connections, first requests
        await paths[name](0)
    out: Rounds = {n: [] for n in names}
    for _ in range(rounds):
        samples: dict[str, list[float]] = {n: [] for n in names}
        for i in range(per_round):
            k = i % len(names)
            for name in names[k:] + names[:k]:
                samples[name].append(await paths[name](i))
                await asyncio.sleep(0.002)
        for name, values in samples.items():
            out[name].append((percentile(values, 50), percentile(values, 99)))
    return out
