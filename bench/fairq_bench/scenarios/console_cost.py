"""Scenario 10, the console's own cost: tokens per fairq core with a console page open or not.

Two measurements, each alternating windows without and with one console page's event stream
open (the queue view, re-rendered and pushed every refresh), in pairs whose order flips each
round, reported as medians over the rounds:

1. the console's CPU per second in the fairq process with a queue standing and no tokens
   flowing (the cost, measured where nothing else moves);
2. a throughput run in front of the firehose: fairq's cores and CPU per token (the
   denominator), and the direct comparison of tokens per core, which a shared machine's
   noise dominates.
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

from fairq_bench.processes import child_process, fairq_module_process, run_seconds, toml_config
from fairq_bench.report import markdown_table
from fairq_bench.scenarios.docs import Report
from fairq_bench.targets import fairq_sender, free_port
from fairq_bench.workload import RequestSpec
from fairq_server.app import FairqServer
from fairq_server.config.schema import (
    BackendConfig,
    Config,
    ConsoleConfig,
    HttpConfig,
    SchedulerConfig,
    TierConfig,
)
from fairq_server.console.render import fragment
from fairq_server.observe.live import read_live
from fairq_sim import SimConfig, SimServer

__all__ = ["console_cost"]

NAME = "console-cost"
STREAM_TOKENS = 500
TARGET_DROP = 0.02
# Open mode: every caller is an admin; a bearer credential is still required.
_BENCH = {"Authorization": "Bearer bench"}


async def _console_client(url: str, frames: list[int]) -> None:
    """Hold the queue view's event stream open, counting the frames pushed."""
    # Open mode: every caller is an admin; a bearer credential is still required.
    headers = _BENCH
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
                        tokens0, cpu0 = counter["received"], run_seconds(proc.pid)
                        await asyncio.sleep(seconds)
                        cpu = run_seconds(proc.pid) - cpu0
                        tokens = counter["received"] - tokens0
                    out[mode].append(tokens / cpu if cpu else 0.0)
                    # fairq's own CPU (its threads' run time) per token streamed.
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


async def console_cpu(
    users: int, per_user: int, seconds: float, rounds: int
) -> dict[str, list[float]]:
    """fairq's CPU per second with a queue standing and no tokens flowing, page open or not.

    A ``fairq serve`` process in front of a simulator that holds one request at a time and
    generates slowly; ``users`` x ``per_user`` requests stand in fairq's queue (every one a
    row of the queue view). With nothing else to do, the process's CPU per second is its idle
    work plus, in the open windows, the console's: read, render, frame and push the queue
    view every refresh. The windows alternate as in :func:`measure`; each round's open minus
    closed is the console's CPU per second, measured in the real process.
    """
    sim_config = SimConfig(mode="vllm", model="sim", speed=0.02, max_num_seqs=1)
    http_port = free_port()
    extra = (
        f'[http]\nlisten = "127.0.0.1:{http_port}"\n[console]\nenabled = true\n'
        '[[tiers]]\nname = "batch"\nmax_backend_waiting = 0\n'
    )
    url = f"http://127.0.0.1:{http_port}"
    out: dict[str, list[float]] = {"closed": [], "open": [], "console": [], "rows": []}
    async with (
        SimServer(sim_config) as sim,
        fairq_module_process(toml_config(sim.url, "sim", "vllm", extra)) as (proc, target),
        grpc.aio.insecure_channel(target) as channel,
        aiohttp.ClientSession() as http,
    ):
        send = fairq_sender(channel, "sim")
        streams = [
            asyncio.create_task(_consume(send(RequestSpec(f"user-{u}", f"q {u} {k}", 64))))
            for u in range(users)
            for k in range(per_user)
        ]
        try:
            deadline = time.monotonic() + 120
            while True:  # until the flood stands in fairq's queue (read as the console does)
                async with http.get(f"{url}/console/api/live", headers=_BENCH) as resp:
                    view = (await resp.json())["replicas"][0]
                queued = sum(n for m in view["models"] for _, n in m["tiers"])
                if queued >= users * per_user - 2:
                    break
                assert time.monotonic() < deadline, f"the flood did not queue ({queued})"
                await asyncio.sleep(0.2)  # polling the queue's depth, bounded above
            out["rows"].append(sum(len(m["rows"]) for m in view["models"]))
            for r in range(rounds):
                pair: dict[str, float] = {}
                for mode in ("closed", "open") if r % 2 == 0 else ("open", "closed"):
                    async with contextlib.AsyncExitStack() as stack:
                        if mode == "open":
                            await stack.enter_async_context(_open_page(url, [0]))
                            await asyncio.sleep(0.5)  # the page connects
                        cpu0 = run_seconds(proc.pid)
                        await asyncio.sleep(seconds)
                        pair[mode] = (run_seconds(proc.pid) - cpu0) / seconds
                    out[mode].append(pair[mode])
                out["console"].append(pair["open"] - pair["closed"])
        finally:
            for task in streams:
                task.cancel()
            await asyncio.gather(*streams, return_exceptions=True)
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
            deadline = time.monotonic() + 120  # a loaded machine takes its time to queue
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
    # Longer windows where little moves: /proc counts CPU in 10 ms ticks.
    idle_seconds, idle_rounds = (2.0, 2) if quick else (10.0, 8)
    idle = await console_cpu(users, per_user, idle_seconds, idle_rounds)
    refresh, rows_listed = await refresh_cpu(users, per_user, refreshes)
    closed, opened = statistics.median(res["closed"]), statistics.median(res["open"])
    drops = sorted(res["paired_drop"])
    drop_ab = statistics.median(drops)
    quart = statistics.quantiles(drops, n=4) if len(drops) > 1 else [drop_ab, drop_ab, drop_ab]
    cpu_closed = statistics.median(res["closed_cpu_us"])
    cpu_open = statistics.median(res["open_cpu_us"])
    cores = statistics.median(res["cores"])
    # The console's CPU per second, measured in the real process with the queue standing:
    # tokens per core drop by that over the CPU fairq spends per second under the
    # throughput run (at most one core: fairq's event loop is one thread).
    console = statistics.median(idle["console"])
    c_quart = statistics.quantiles(idle["console"], n=4) if idle_rounds > 1 else [console] * 3
    drop = max(0.0, console) / cores if cores else 0.0
    drop_saturated = max(0.0, console) / 1.0
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
        f"with {users * per_user} requests of {users} users standing in the queue, one open "
        f"console page costs fairq {console * 1000:.2f} ms of CPU per second (median of "
        f"{idle_rounds} paired rounds measured in the process, quartiles "
        f"{c_quart[0] * 1000:.2f} to "
        f"{c_quart[2] * 1000:.2f} ms): tokens per core drop by {drop:.2%} at the {cores:.2f} "
        f"cores fairq used in the throughput run, {drop_saturated:.2%} when fairq saturates "
        f"its core (target: at most {TARGET_DROP:.0%}). Measured directly under the throughput "
        f"run, tokens per core moved by {-drop_ab:+.2%} (median of paired windows; quartiles "
        f"{-quart[2]:+.2%} to {-quart[0]:+.2%}): the machine's noise, well above the cost."
    )
    report.add(
        "Setup",
        f"""
One `fairq serve` process with the HTTP door and `[console] enabled = true` (refresh 1 s).
Windows ({idle_seconds:g} s in 1, {seconds:g} s in 2) alternate between no console client
and one client holding the queue view's event stream (`/console/events?view=queues`) open,
the order flipped each round;
each round is one pair of adjacent windows, so the machine's load drifting between rounds
falls on both halves, and every figure is a median over the rounds ({idle_rounds} in 1,
{rounds} in 2). CPU: the fairq
process's threads' run time from the kernel's scheduler (`/proc/<pid>/task/*/schedstat`,
to the nanosecond; `/proc/<pid>/stat` counts 10 ms ticks, as coarse as the cost measured).

1. **The console's CPU, in the process.** fairq in front of a simulator holding one request
   at a time, {users} users x {per_user} requests standing in fairq's queue (the queue view
   lists {idle["rows"][0] if idle["rows"] else 0} user rows), no tokens flowing to speak of:
   each round's open-window CPU per second minus its closed-window CPU per second.
2. **The throughput run.** fairq in front of the firehose (one SSE event per token per
   stream every 10 ms), {streams} closed-loop streams of {STREAM_TOKENS} tokens through the
   gRPC door, 16 users: fairq's cores and CPU per token, page open or not.

The drop in tokens per core is (1)'s CPU per second over (2)'s cores: the console does the same
work whatever the token rate (one refresh per second, one frame per page).
""",
    )
    report.add(
        "The console's CPU per second, in the process (idle queue)",
        markdown_table(
            ["", "closed (CPU s/s)", "open (CPU s/s)", "open - closed (ms/s)"],
            [
                [str(i + 1), f"{a:.4f}", f"{b:.4f}", f"{(b - a) * 1000:.2f}"]
                for i, (a, b) in enumerate(zip(idle["closed"], idle["open"], strict=True))
            ],
        ),
    )
    report.add(
        "One refresh, in process",
        f"""
An in-process fairq with the same queue; {refreshes} refreshes of the queue view (read the
core, render the fragment, frame the event) timed with the process's CPU clock:
{refresh * 1000:.3f} ms each, {rows_listed} user rows listed.
""",
    )
    report.add("Tokens per fairq core under the throughput run", markdown_table(header, rows))
    report.add(
        "Reproduce",
        f"`uv run fairq bench console-cost --backend sim{' --quick' if quick else ''}` "
        f"(this run: {time.monotonic() - started:.0f} s).",
    )
    report.write(out, quick)
    print(markdown_table(header, rows))
    print(
        f"  console CPU with the queue standing: {console * 1000:.2f} ms/s (quartiles "
        f"{c_quart[0] * 1000:.2f} .. {c_quart[2] * 1000:.2f}); one refresh in process "
        f"{refresh * 1000:.3f} ms"
    )
    print(f"  tokens per core drop: {drop:.2%} at {cores:.2f} cores, {drop_saturated:.2%} at 1")
    print(
        f"  under the throughput run, median of {len(drops)} paired rounds: {-drop_ab:+.2%} "
        f"(quartiles {-quart[2]:+.2%} .. {-quart[0]:+.2%}); "
        f"CPU per token {cpu_closed:.2f} -> {cpu_open:.2f} µs"
    )
    if not quick:
        return drop <= TARGET_DROP
    # Quick (CI's guard against a collapse): 2 pairs of 2 s windows put the console's CPU
    # between -1.8 and 8.7 ms/s around a median of 0.1-3.5 ms/s (3 runs), so the target at
    # fairq's 0.23-0.32 cores would fail on noise alone. The guard holds the target at a
    # saturated core (20 ms/s: a console rendering several times more than it should) and
    # for the one refresh a second timed in process, which noise does not move.
    return drop_saturated <= TARGET_DROP and refresh <= TARGET_DROP * cores
