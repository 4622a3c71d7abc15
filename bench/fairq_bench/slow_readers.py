"""Slow readers must not slow the backend down for everyone else.

``python -m fairq_bench.slow_readers [--before PYTHON] [--seconds S]``

A simulated vLLM (16 slots) behind fairq; for ``--seconds`` ten users stream requests back to
back while 50 other clients each stream one long request. Two runs: the 50 read as fast as
they can (all fast), then they read one message a second (slow). The figure is the ten users'
tokens per second, slow / all-fast. fairq
reads each backend stream at the backend's pace and reports a request's first token and end
as the backend produces them, so a slow reader holds neither a backend slot nor the gate.
``--before`` runs the same pair with another checkout's fairq for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_bench.processes import fairq_process, sim_process, toml_config

__all__ = ["RunResult", "main", "run"]

MODEL = "sim"
SLOW = 50
FAST = 10


@dataclass(frozen=True)
class RunResult:
    """One run's throughput: the ten users' completed tokens per second."""

    fast_tok_s: float


def _request(tokens: int, prompt: str) -> scheduler_pb2.GenerateRequest:
    return scheduler_pb2.GenerateRequest(
        model=MODEL,
        prompt=prompt,
        sampling=scheduler_pb2.SamplingParams(max_tokens=tokens, ignore_eos=True),
    )


async def _slow_client(stub: scheduler_pb2_grpc.SchedulerAsyncStub, i: int, pause: float) -> None:
    call = stub.Generate(_request(2000, f"slow reader {i}"), metadata=(("x-fairq-user", f"s{i}"),))
    try:
        async for _ in call:
            if pause:
                await asyncio.sleep(pause)
    except grpc.aio.AioRpcError:
        pass  # cut off for not reading: allowed, and nothing to measure here


async def _fast_user(stub: scheduler_pb2_grpc.SchedulerAsyncStub, i: int, until: float) -> int:
    tokens = 0
    while time.monotonic() < until:
        async for event in stub.Generate(
            _request(100, f"fast user {i}"), metadata=(("x-fairq-user", f"f{i}"),)
        ):
            if event.WhichOneof("event") == "finished":
                tokens += event.finished.usage.completion_tokens
    return tokens


async def run(url: str, python: str, pause: float, seconds: float) -> RunResult:
    """One run through a fresh fairq; ``pause`` seconds between a slow client's reads."""
    async with (
        fairq_process(toml_config(url, MODEL, "vllm"), python) as target,
        grpc.aio.insecure_channel(target) as channel,
    ):
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        slow = [asyncio.create_task(_slow_client(stub, i, pause)) for i in range(SLOW)]
        await asyncio.sleep(1.0)  # the slow clients' requests are in
        started = time.monotonic()
        until = started + seconds
        fast = await asyncio.gather(*(_fast_user(stub, i, until) for i in range(FAST)))
        elapsed = time.monotonic() - started
        for task in slow:
            task.cancel()
        await asyncio.gather(*slow, return_exceptions=True)
    return RunResult(sum(fast) / elapsed)


async def compare(pythons: Sequence[tuple[str, str]], seconds: float) -> list[str]:
    """Markdown rows: all-fast vs slow readers for each fairq."""
    args = ("--mode", "vllm", "--model", MODEL, "--max-num-seqs", "16", "--speed", "2")
    rows = []
    async with sim_process(*args) as url:
        for label, python in pythons:
            fast = await run(url, python, 0.0, seconds)
            print(f"{label} all fast: {fast}", flush=True)
            slow = await run(url, python, 1.0, seconds)
            print(f"{label} slow readers: {slow}", flush=True)
            rows.append(
                f"| {label} | {fast.fast_tok_s:.0f} | {slow.fast_tok_s:.0f} "
                f"| {slow.fast_tok_s / fast.fast_tok_s:.2f}x |"
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", default="", help="python of another fairq checkout")
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args(argv)
    pythons = [("this fairq", sys.executable)]
    if args.before:
        pythons.append(("before", args.before))
    rows = asyncio.run(compare(pythons, args.seconds))
    print(
        "| fairq | 10 users' tok/s, 50 others reading fast | 50 others reading 1 msg/s "
        "| ratio |\n|---|---|---|---|"
    )
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
