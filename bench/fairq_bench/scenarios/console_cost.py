"""Scenario 10, the console's own cost: tokens per fairq core with a console page open or not.

One fairq process, the HTTP door and the console on (default refresh, 1 s), in front of the
firehose (a token source that is not the bottleneck). Closed-loop streams through the gRPC
door run throughout; the measurement alternates windows with no console client and windows
with one console page's server-sent-event stream open (the queue view, re-rendered and pushed
every refresh), the order flipped each round so drift in the machine's load falls on both.
Tokens per core is tokens counted at the client per CPU second of the fairq process; the
result is the median over rounds of each round's paired ratio (open over closed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
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
from fairq_server.app import FairqServer
from fairq_server.config import (
    BackendConfig,
    Config,
    ConsoleConfig,
    HttpConfig,
    SchedulerConfig,
    TierConfig,
)
from fairq_server.http.console.render import fragment
from fairq_server.observe.live import read_live
from fairq_sim import SimConfig, SimServer

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
    out: dict[str, list[float]] = {"closed": [], "open": [], "frames": [], "cores": []}
    out |= {"closed_cpu_us": [], "open_cpu_us": [], "paired_drop": []}
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
                pair: dict[str, float] = {}
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
                    # fairq's own CPU (user + system, from /proc) per token streamed.
                    out[f"{mode}_cpu_us"].append(cpu / tokens * 1e6 if tokens else 0.0)
                    pair[mode] = out[mode][-1]
                    out["cores"].append(cpu / seconds)
                    if mode == "open":
                        out["frames"].append(frames[0] / seconds)
                # Adjacent windows share the machine's load of the moment: their ratio is the
                # robust figure, the median over rounds the result.
                if pair["closed"]:
                    out["paired_drop"].append(1 - pair["open"] / pair["closed"])
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return out


async def refresh_cpu(users: int, per_user: int, refreshes: int) -> tuple[float, int]:
    """CPU seconds of one console refresh (read, render, frame) with a realistic queue.

    An in-process fairq in front of a slow simulator, ``users`` users with ``per_user``
    requests each queued; the refresh is what the feed does once per ``refresh_seconds``
    for the queue view, timed with the process's CPU clock. Returns (seconds, rows listed).
    """
    sim_config = SimConfig(mode="vllm", model="sim", speed=0.02, max_num_seqs=1)
    async with SimServer(sim_config) as sim:
        config = Config(
            listen="127.0.0.1:0",
            scheduler=SchedulerConfig(poll_interval_seconds=0.05),
            tiers=(TierConfig("batch", max_backend_waiting=0),),
            backends=(BackendConfig("sim-a", "vllm", sim.url, ("sim",)),),
            http=HttpConfig(listen="127.0.0.1:0"),
            console=ConsoleConfig(enabled=True),
        )
        async with (
            FairqServer(config) as server,
            grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
        ):
            send = fairq_sender(channel, "sim")
            streams = [
                asyncio.create_task(_consume(send(RequestSpec(f"user-{u}", f"q {u} {k}", 64))))
                for u in range(users)
                for k in range(per_user)
            ]
            model = server.core.dispatcher.queue("sim")
            deadline = time.monotonic() + 30
            while len(model) < users * per_user - 2:
                assert time.monotonic() < deadline, "the flood did not queue"
                await asyncio.sleep(0.05)  # polling the queue's length, bounded
            recent = server.request_log.recent
            start = time.process_time()
            for _ in range(refreshes):
                view = read_live(server.core, recent).to_json()
                html = fragment("queues", [view], "")
                frame = f"data: {json.dumps({'html': html})}\n\n".encode()
            cost = (time.process_time() - start) / refreshes
            rows = sum(len(m["rows"]) for m in view["models"])
            assert frame
            for task in streams:
                task.cancel()
            await asyncio.gather(*streams, return_exceptions=True)
    return cost, rows


async def _consume(stream: AsyncIterator[str]) -> None:
    async for _ in stream:
        pass


async def console_cost(args: argparse.Namespace, url: str, out: Path) -> bool:
    """Run scenario 10; True if the console page costs at most a few percent of tokens/core."""
    quick = args.quick
    streams, seconds, rounds = (32, 2.0, 2) if quick else (64, 4.0, 12)
    users, per_user, refreshes = (16, 4, 50) if quick else (16, 8, 300)
    argv = ["-m", "fairq_bench.scenarios.firehose", "--step-ms", "10"]
    started = time.monotonic()
    async with child_process(argv, r"^(http://\S+)") as (_, hose):
        res = await measure(hose, args.model, streams, seconds, rounds)
    print(json.dumps({k: [round(x, 5) for x in v] for k, v in res.items()}), flush=True)
    refresh, rows_listed = await refresh_cpu(users, per_user, refreshes)
    closed, opened = statistics.median(res["closed"]), statistics.median(res["open"])
    drops = sorted(res["paired_drop"])
    drop_ab = statistics.median(drops)
    quart = statistics.quantiles(drops, n=4) if len(drops) > 1 else [drop_ab, drop_ab, drop_ab]
    cpu_closed = statistics.median(res["closed_cpu_us"])
    cpu_open = statistics.median(res["open_cpu_us"])
    cores = statistics.median(res["cores"])
    # The console adds one refresh of CPU per refresh interval (1 s): tokens per core drop by
    # that over the CPU fairq spends per second at this load.
    drop = refresh / 1.0 / cores if cores else 0.0
    rows = [
        [
            "no console page",
            f"{closed:.0f}",
            f"{cpu_closed:.2f}",
            " ".join(f"{x:.0f}" for x in res["closed"]),
            "",
        ],
        [
            "one console page open (SSE)",
            f"{opened:.0f}",
            f"{cpu_open:.2f}",
            " ".join(f"{x:.0f}" for x in res["open"]),
            f"{statistics.median(res['frames']):.2f}",
        ],
    ]
    header = [
        "",
        "tokens per fairq core (median)",
        "fairq CPU µs per token (median)",
        "per window",
        "frames/s pushed",
    ]
    report = Report(NAME, "The console's own cost: tokens per core with a page open")
    report.result = (
        f"one console refresh (queue view, {users * per_user} requests of {users} users queued) "
        f"costs {refresh * 1000:.2f} ms of CPU, once a second: {drop:.2%} of the "
        f"{cores:.2f} cores fairq used under the throughput run (target: at most "
        f"{TARGET_DROP:.0%}). End to end, over {len(drops)} rounds of adjacent windows, tokens "
        f"per fairq core with a page open changed by {-drop_ab:+.2%} (median of the rounds' "
        f"paired ratios; quartiles {-quart[2]:+.2%} to {-quart[0]:+.2%})."
    )
    report.add(
        "Setup",
        f"""
One `fairq serve` process with the HTTP door and `[console] enabled = true` (refresh 1 s), in
front of the firehose (one SSE event per token per stream every 10 ms). {streams} closed-loop
streams of {STREAM_TOKENS} tokens through the gRPC door, 16 users, run throughout. Windows of
{seconds:g} s alternate between no console client and one client holding the queue view's
event stream (`/console/events?view=queues`) open, the order flipped each round. Tokens per
core: tokens counted at the client over the fairq process's CPU seconds (`/proc`, user plus
system). Each round is one pair of adjacent windows; the end-to-end figure is the median over
rounds of the pair's ratio, so the machine's load drifting between rounds cancels out.
""",
    )
    report.add(
        "One refresh, in process",
        f"""
An in-process fairq in front of a slow simulator with {users} users x {per_user} requests
queued; {refreshes} refreshes of the queue view (read the core, render the fragment, frame
the event) timed with the process's CPU clock: {refresh * 1000:.3f} ms each, {rows_listed}
user rows listed. The feed does one refresh per `refresh_seconds` (1 s) however many pages
are open; each open page adds one write of the frame.
""",
    )
    report.add("Tokens per fairq core, end to end", markdown_table(header, rows))
    report.add(
        "Reproduce",
        f"`uv run fairq bench console-cost --backend sim{' --quick' if quick else ''}` "
        f"(this run: {time.monotonic() - started:.0f} s).",
    )
    report.write(out, quick)
    print(markdown_table(header, rows))
    print(f"  one refresh: {refresh * 1000:.3f} ms CPU; {drop:.2%} of {cores:.2f} fairq cores")
    print(
        f"  end to end, median of {len(drops)} paired rounds: {-drop_ab:+.2%} "
        f"(quartiles {-quart[2]:+.2%} .. {-quart[0]:+.2%}); "
        f"CPU per token {cpu_closed:.2f} -> {cpu_open:.2f} µs"
    )
    return drop <= TARGET_DROP and drop_ab <= TARGET_DROP
