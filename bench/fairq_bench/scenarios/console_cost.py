"""Scenario 10, the console's own cost: tokens per fairq core with a console page open or not.

One fairq process, the HTTP door and the console on (default refresh, 1 s), in front of the
firehose (a token source that is not the bottleneck). Closed-loop streams through the gRPC
door run throughout; the measurement alternates windows with no console client and windows
with one console page's server-sent-event stream open (the queue view, re-rendered and pushed
every refresh), the order flipped each round so drift in the machine's load falls on both.
Tokens per core is tokens counted at the client per CPU second of the fairq process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc

from fairq_bench.processes import toml_config
from fairq_bench.report import markdown_table
from fairq_bench.scenarios.docs import Report
from fairq_bench.scenarios.procs import child_process, cpu_seconds, fairq_module_process
from fairq_bench.targets import fairq_sender, free_port
from fairq_bench.workload import RequestSpec

__all__ = ["console_cost"]

NAME = "console-cost"
STREAM_TOKENS = 500
TARGET_DROP = 0.02


async def _console_client(url: str, frames: list[int]) -> None:
    """Hold the queue view's event stream open, counting the frames pushed."""
    # Open mode: every caller is an admin; a bearer credential is still required.
    headers = {"Authorization": "Bearer bench"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/console/events?view=queues", headers=headers) as resp,
    ):
        resp.raise_for_status()
        async for line in resp.content:
            if line.startswith(b"data: "):
                frames[0] += 1


@contextlib.asynccontextmanager
async def _open_page(url: str, frames: list[int]) -> AsyncIterator[None]:
    task = asyncio.create_task(_console_client(url, frames))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def measure(
    source: str, model: str, streams: int, seconds: float, rounds: int
) -> dict[str, list[float]]:
    """Tokens per fairq core in alternating windows without and with a console page open."""
    http_port = free_port()
    extra = f'[http]\nlisten = "127.0.0.1:{http_port}"\n[console]\nenabled = true\n'
    url = f"http://127.0.0.1:{http_port}"
    out: dict[str, list[float]] = {"closed": [], "open": [], "frames": []}
    async with (
        fairq_module_process(toml_config(source, model, "vllm", extra)) as (proc, target),
        grpc.aio.insecure_channel(target) as channel,
    ):
        send = fairq_sender(channel, model)
        counter = {"received": 0}

        async def worker(index: int) -> None:
            k = 0
            while True:
                spec = RequestSpec(f"user-{index % 16}", f"s {index} r {k}", STREAM_TOKENS)
                async for text in send(spec):
                    counter["received"] += len(text)  # the firehose: one character a token
                k += 1

        tasks = [asyncio.create_task(worker(i)) for i in range(streams)]
        await asyncio.sleep(5.0)  # ramp-up: connections, caches, the loop at its steady pace
        try:
            for r in range(rounds):
                for mode in ("closed", "open") if r % 2 == 0 else ("open", "closed"):
                    frames = [0]
                    async with contextlib.AsyncExitStack() as stack:
                        if mode == "open":
                            await stack.enter_async_context(_open_page(url, frames))
                            await asyncio.sleep(0.5)  # the page connects
                        tokens0, cpu0 = counter["received"], cpu_seconds(proc.pid)
                        await asyncio.sleep(seconds)
                        cpu = cpu_seconds(proc.pid) - cpu0
                        tokens = counter["received"] - tokens0
                    out[mode].append(tokens / cpu if cpu else 0.0)
                    if mode == "open":
                        out["frames"].append(frames[0] / seconds)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return out


async def console_cost(args: argparse.Namespace, url: str, out: Path) -> bool:
    """Run scenario 10; True if the console page costs at most a few percent of tokens/core."""
    quick = args.quick
    streams, seconds, rounds = (32, 2.0, 2) if quick else (64, 5.0, 6)
    argv = ["-m", "fairq_bench.scenarios.firehose", "--step-ms", "10"]
    started = time.monotonic()
    async with child_process(argv, r"^(http://\S+)") as (_, hose):
        res = await measure(hose, args.model, streams, seconds, rounds)
    closed, opened = statistics.mean(res["closed"]), statistics.mean(res["open"])
    drop = 1 - opened / closed if closed else 0.0
    rows = [
        ["no console page", f"{closed:.0f}", " ".join(f"{x:.0f}" for x in res["closed"]), ""],
        [
            "one console page open (SSE)",
            f"{opened:.0f}",
            " ".join(f"{x:.0f}" for x in res["open"]),
            f"{statistics.mean(res['frames']):.2f}",
        ],
    ]
    header = ["", "tokens per fairq core (mean)", "per window", "frames/s pushed"]
    report = Report(NAME, "The console's own cost: tokens per core with a page open")
    report.result = (
        f"with one console page open, tokens per fairq core change by {-drop:+.1%} "
        f"(target: a drop of at most {TARGET_DROP:.0%}); {rounds} rounds of {seconds:g} s windows."
    )
    report.add(
        "Setup",
        f"""
One `fairq serve` process with the HTTP door and `[console] enabled = true` (refresh 1 s), in
front of the firehose (one SSE event per token per stream every 10 ms). {streams} closed-loop
streams of {STREAM_TOKENS} tokens through the gRPC door, 16 users, run throughout. Windows of
{seconds:g} s alternate between no console client and one client holding the queue view's
event stream (`/console/events?view=queues`) open, the order flipped each round. Tokens per
core: tokens counted at the client over the fairq process's CPU seconds (`/proc`).
""",
    )
    report.add("Tokens per fairq core", markdown_table(header, rows))
    report.add(
        "Reproduce",
        f"`uv run fairq bench console-cost --backend sim{' --quick' if quick else ''}` "
        f"(this run: {time.monotonic() - started:.0f} s).",
    )
    report.write(out, quick)
    print(markdown_table(header, rows))
    print(f"  drop: {drop:.2%}")
    # Quick runs are too short for a 2 % resolution on a shared machine: they check the sign
    # of gross regressions only.
    return drop <= (0.10 if quick else TARGET_DROP)
