"""Scenario 9, the HTTP door's cost: added TTFT and tokens/s, beside direct and the gRPC door.

One fairq process serves both doors in front of one backend. Latency: short requests one at a
time, rotating between straight to the backend, through the gRPC door and through the HTTP
door (the same OpenAI body as direct, so the HTTP client's cost cancels out), and through a
bare relay (:mod:`.bare_relay`: one more process that forwards bytes and does nothing else,
the reference for what any extra hop costs on the machine), in wall-clock time to the first
token. Throughput: closed-loop streams through each door in turn from the
firehose (a token source that is not the bottleneck), tokens counted at the client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from fairq_bench.processes import child_process, cpu_seconds, fairq_module_process, toml_config
from fairq_bench.report import markdown_table
from fairq_bench.scenarios.docs import Report
from fairq_bench.scenarios.runs import p
from fairq_bench.targets import aiohttp_session, fairq_sender, free_port, openai_sender
from fairq_bench.workload import RequestSpec, SendFn, time_to_first_text

__all__ = ["http_overhead"]

NAME = "http-overhead"
TARGET_P50 = 0.001
STREAM_TOKENS = 500


def _config(url: str, model: str, kind: str, http_port: int) -> str:
    return toml_config(url, model, kind, f'[http]\nlisten = "127.0.0.1:{http_port}"\n')


@contextlib.asynccontextmanager
async def _fairq(
    url: str, model: str, kind: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, SendFn, SendFn]]:
    """fairq with both doors; yields the process and the gRPC and HTTP senders."""
    http_port = free_port()
    async with (
        aiohttp_session() as session,
        fairq_module_process(_config(url, model, kind, http_port)) as (proc, target),
        grpc.aio.insecure_channel(target) as channel,
    ):
        grpc_send = fairq_sender(channel, model)
        http_send = openai_sender(session, f"http://127.0.0.1:{http_port}", model)
        yield proc, grpc_send, http_send


async def latency(url: str, model: str, kind: str, n: int) -> dict[str, list[float]]:
    """TTFTs of ``n`` short requests per path, rotating which path goes first."""
    out: dict[str, list[float]] = {"direct": [], "relay": [], "grpc": [], "http": []}
    relay_argv = ["-m", "fairq_bench.scenarios.bare_relay", "--backend", url]
    async with (
        aiohttp_session() as session,
        child_process(relay_argv, r"^(http://\S+)") as (_, relay_url),
        _fairq(url, model, kind) as (_, grpc_send, http_send),
    ):
        senders = {"direct": openai_sender(session, url, model),
                   "relay": openai_sender(session, relay_url, model),
                   "grpc": grpc_send, "http": http_send}  # fmt: skip
        warm = RequestSpec("probe", "warm up", 4)
        for send in [*senders.values()] * 2:
            await time_to_first_text(send, warm)
        names = list(senders)
        for i in range(n):
            spec = RequestSpec("probe", f"Short question number {i}?", 8)
            k = i % len(names)
            for name in names[k:] + names[:k]:
                out[name].append(await time_to_first_text(senders[name], spec))
                await asyncio.sleep(0.02)  # low load: the backend is idle again
    return out


async def throughput(
    source: str, model: str, streams: int, seconds: float
) -> dict[str, dict[str, float]]:
    """Tokens/s and fairq CPU for the gRPC and the HTTP door, one after the other."""
    results: dict[str, dict[str, float]] = {}
    async with _fairq(source, model, "vllm") as (proc, grpc_send, http_send):
        for name, send in (("grpc", grpc_send), ("http", http_send)):
            counter = {"received": 0, "counting": 0}

            async def worker(
                index: int, send: SendFn = send, counter: dict[str, int] = counter
            ) -> None:
                k = 0
                while True:
                    spec = RequestSpec(f"user-{index % 16}", f"s {index} r {k}", STREAM_TOKENS)
                    async for text in send(spec):
                        # The firehose sends one character per token.
                        counter["received"] += len(text) * counter["counting"]
                    k += 1

            tasks = [asyncio.create_task(worker(i)) for i in range(streams)]
            await asyncio.sleep(2.0)  # ramp-up
            counter["counting"] = 1
            cpu0, own0, t0 = cpu_seconds(proc.pid), time.process_time(), time.monotonic()
            await asyncio.sleep(seconds)
            counter["counting"] = 0
            elapsed = time.monotonic() - t0
            cpu = cpu_seconds(proc.pid) - cpu0
            own = time.process_time() - own0
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            results[name] = {
                "tokens_per_second": counter["received"] / elapsed,
                "fairq_cores": cpu / elapsed,
                "client_cores": own / elapsed,
            }
    return results


async def http_overhead(args: argparse.Namespace, url: str, out: Path) -> bool:
    """Run scenario 9; True if the HTTP door's added p50 is within a loose bound."""
    quick = args.quick
    n = 30 if quick else 150
    print(f"  latency: {n} requests per path, rotating", flush=True)
    lat = await latency(url, args.model, args.kind, n)
    d, rl, g, h = lat["direct"], lat["relay"], lat["grpc"], lat["http"]
    streams, seconds = (64, 3.0) if quick else (128, 6.0)
    argv = ["-m", "fairq_bench.scenarios.firehose", "--step-ms", "10"]
    async with child_process(argv, r"^(http://\S+)") as (_, hose):
        tput = await throughput(hose, args.model, streams, seconds)
    ms = 1000.0
    rows_l: list[list[str | float]] = [
        ["straight to the backend", p(d, 50) * ms, p(d, 99) * ms, "", "", ""],
        *[
            [label, p(x, 50) * ms, p(x, 99) * ms, (p(x, 50) - p(d, 50)) * ms,
             (p(x, 99) - p(d, 99)) * ms, "" if x is rl else (p(x, 50) - p(rl, 50)) * ms]
            for label, x in (("through a bare relay (reference hop)", rl),
                             ("through the gRPC door", g), ("through the HTTP door", h))
        ],
    ]  # fmt: skip
    lat_header = ["", "TTFT p50", "TTFT p99", "added p50", "added p99", "p50 beyond the relay"]
    rows_t = [
        [door, streams, r["tokens_per_second"], r["fairq_cores"], r["client_cores"]]
        for door, r in tput.items()
    ]
    added_http = p(h, 50) - p(d, 50)
    beyond_relay = p(h, 50) - p(rl, 50)
    report = Report(NAME, "HTTP door overhead: added TTFT and tokens/s, beside the gRPC door")
    report.result = (
        f"the HTTP door adds {added_http * ms:.2f} ms to TTFT p50 (target 1 ms; gRPC door "
        f"{(p(g, 50) - p(d, 50)) * ms:.2f} ms), of which a bare relay process costs "
        f"{(p(rl, 50) - p(d, 50)) * ms:.2f} ms and fairq's own work {beyond_relay * ms:.2f} ms, "
        f"and relays {tput['http']['tokens_per_second']:.0f}"
        f" tokens/s through one process (gRPC door {tput['grpc']['tokens_per_second']:.0f})."
    )
    report.add(
        "Setup",
        f"""
One `fairq serve` process with both doors on (`[http] listen`), default settings, in front
of `{args.backend}` ({args.kind}). Latency: {n} requests per path (8-token prompts, 8 output
tokens), one at a time, the order of the four paths rotating each round; direct, the relay and
HTTP send the same OpenAI `/v1/completions` body with the same client (aiohttp), gRPC uses
fairq's Python client. The bare relay (`bench/scenarios/bare_relay.py`) is one more process
that forwards the request and streams the bytes back and does nothing else: what it adds is
what an extra hop costs on this machine (socket round trips, waking one more process), and
"beyond the relay" is fairq's own work. Throughput: {streams} closed-loop streams of
{STREAM_TOKENS} tokens through each door in turn, for {seconds:g} s after a 2 s ramp-up,
from the firehose (one SSE event per token per stream every 10 ms). All processes share the
machine's cores; "cores" is CPU seconds per second from `/proc`.
""",
    )
    report.add(
        "Latency at low load (ms)",
        markdown_table(lat_header, rows_l),
    )
    report.add(
        "Throughput through one process",
        markdown_table(["door", "streams", "tokens/s", "fairq cores", "client cores"], rows_t),
    )
    report.add(
        "Reproduce",
        f"`uv run fairq bench http-overhead --backend sim{' --quick' if quick else ''}`; "
        "against a real vLLM: `uv run fairq bench http-overhead --backend http://HOST:PORT "
        "--model MODEL`.",
    )
    report.write(out, quick)
    print(markdown_table(lat_header, rows_l))
    print(markdown_table(["door", "streams", "tokens/s", "fairq cores", "client cores"], rows_t))
    return added_http < 0.010 and tput["http"]["tokens_per_second"] > 1_000
