"""``python -m fairq_bench.hot_path.floor``: fairq's doors beside relays that do nothing else.

The hot path's targets (60,000 tokens per core-second, 0.5 ms added to the first token) are
about Python's floor as much as fairq's work. This measures the floor on the machine at hand,
side by side with fairq's HTTP door, all on fairq's core with the same load, in one run:

- **bare relay**: aiohttp server and client on uvloop, each read of the backend written on
  as it comes (``fairq_bench.scenarios.bare_relay --uvloop``): what one more Python process
  between caller and backend costs at the least;
- **bare relay + parse**: the same, also splitting every read into its SSE events and decoding
  each event's JSON with orjson, the least a relay that validates what it forwards does;
- **fairq, HTTP door**: this checkout's ``fairq serve``;
- **bare gRPC relay**: ``Scheduler/Generate`` served by grpc.aio on uvloop, each backend
  read parsed and sent on as one message (``fairq_bench.scenarios.bare_grpc_relay``);
- **fairq, gRPC door**: the same ``fairq serve``;
- with ``--nginx``, **nginx**: a compiled streaming reverse proxy (one worker, unbuffered),
  what relaying the same bytes costs outside Python (``nginx_relay``).

Rounds rotate the order of the five under the throughput load (closed-loop streams of 200
tokens at a token every 10 ms each), then the added time to first token at low load (one
two-token request at a time, the paths' order rotating, against straight to the backend
with the HTTP client: the gRPC rows include the difference between the two clients).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import grpc

from fairq_bench.hot_path.load import (
    Probe,
    Rate,
    Stream,
    background,
    grpc_probe,
    grpc_stream,
    http_probe,
    http_stream,
    latency_rounds,
    measure,
)
from fairq_bench.hot_path.nginx_relay import nginx_relay
from fairq_bench.hot_path.setup import HTTP_LIMITS, TIERS, paced_backend, pinned
from fairq_bench.processes import child_process, fairq_module_process, toml_config
from fairq_bench.report import markdown_table
from fairq_bench.targets import free_port

__all__ = ["main"]

RELAYS = (
    "HTTP: bare relay",
    "HTTP: bare relay + parse",
    "HTTP: fairq",
    "gRPC: bare relay + parse",
    "gRPC: fairq",
)
STREAM_TOKENS = 200


NGINX = "HTTP: nginx (compiled)"


@dataclass(frozen=True)
class Relay:
    """One relay: its processes, and its load and probe through the door measured."""

    pids: list[int]
    stream: Stream
    probe: Probe


@contextlib.asynccontextmanager
async def _relays(
    nginx: bool,
) -> AsyncIterator[tuple[str, aiohttp.ClientSession, dict[str, Relay]]]:
    """The backend and the relays; yields the backend, a session and each relay."""
    async with contextlib.AsyncExitStack() as stack:
        where, backend, session = await paced_backend(stack)
        found: dict[str, Relay] = {}

        def over_http(pid: int, url: str) -> Relay:
            return Relay([pid], http_stream(session, url), http_probe(session, url))

        async def over_grpc(pid: int, target: str) -> Relay:
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(target))
            await channel.channel_ready()
            return Relay([pid], grpc_stream(channel), grpc_probe(channel))

        relay = ["-m", "fairq_bench.scenarios.bare_relay", "--backend", backend, "--uvloop"]
        for name, extra in zip(RELAYS[:2], ([], ["--parse"]), strict=True):
            proc, url = await stack.enter_async_context(
                child_process([*relay, *extra], r"^(http://\S+)", cpus=sorted(where.fairq))
            )
            found[name] = over_http(proc.pid, url)
        proc, target = await stack.enter_async_context(
            child_process(
                ["-m", "fairq_bench.scenarios.bare_grpc_relay", "--backend", backend],
                r"^(\S+:\d+)", cpus=sorted(where.fairq),
            )
        )  # fmt: skip
        found[RELAYS[3]] = await over_grpc(proc.pid, target)
        http = free_port()
        text = toml_config(
            backend, "sim", "vllm", f'[http]\nlisten = "127.0.0.1:{http}"\n{HTTP_LIMITS}{TIERS}'
        )
        with pinned(where.fairq):
            proc, target = await stack.enter_async_context(fairq_module_process(text))
        found[RELAYS[2]] = over_http(proc.pid, f"http://127.0.0.1:{http}")
        found[RELAYS[4]] = await over_grpc(proc.pid, target)
        if nginx:
            pids, url = await stack.enter_async_context(nginx_relay(backend, sorted(where.fairq)))
            found[NGINX] = Relay(pids, http_stream(session, url), http_probe(session, url))
        yield backend, session, found


async def _run(args: argparse.Namespace) -> None:
    async with _relays(args.nginx) as (backend, session, relays):
        names = list(relays)
        for name in names:  # warm-up: first imports, pools
            async with background(relays[name].stream, args.streams, 20):
                await asyncio.sleep(args.warmup)
        rates: dict[str, list[Rate]] = {name: [] for name in names}
        n = len(names)
        for r in range(args.rounds):
            for name in names[r % n :] + names[: r % n]:
                relay = relays[name]
                async with background(relay.stream, args.streams, STREAM_TOKENS):
                    await asyncio.sleep(1.0)
                    rate = await measure(session, backend, relay.pids, args.seconds)
                rates[name].append(rate)
                print(f"  round {r + 1}/{args.rounds} {name:>24}: "
                      f"{rate.per_core_second:,.0f} tokens per core-second "
                      f"({rate.tokens_per_second:,.0f}/s, {rate.fairq_cores:.2f} cores)",
                      flush=True)  # fmt: skip
        low = await _low_load(session, backend, relays, args.probes)
    rows = []
    for name in names:
        got = rates[name]
        p50, p99 = low[name]
        rows.append([
            name,
            f"{statistics.median(x.per_core_second for x in got):,.0f}",
            f"{statistics.median(x.tokens_per_second for x in got):,.0f}",
            f"{statistics.median(x.fairq_cores for x in got):.2f}",
            f"{statistics.median(x.fairq_cores / x.tokens_per_second * 1e6 for x in got):.1f}",
            f"{p50 * 1000:.2f}",
            f"{p99 * 1000:.2f}",
        ])  # fmt: skip
    header = ["relay", "tokens per core-second", "tokens/s", "cores", "µs CPU per token",
              "added TTFT p50 ms", "added TTFT p99 ms"]  # fmt: skip
    print(f"\n{args.streams} streams, {args.rounds} rounds of {args.seconds} s, medians; "
          f"low load {args.probes} probes per path\n")  # fmt: skip
    print(markdown_table(header, rows))


async def _low_load(
    session: aiohttp.ClientSession,
    backend: str,
    relays: dict[str, Relay],
    probes: int,
) -> dict[str, tuple[float, float]]:
    """Added p50/p99 per relay: one probe at a time, the paths' order rotating."""
    paths = {"direct": http_probe(session, backend)}
    paths |= {name: relay.probe for name, relay in relays.items()}
    rounds = await latency_rounds(paths, 1, probes)
    base50, base99 = rounds.pop("direct")[0]
    return {name: (got[0][0] - base50, got[0][1] - base99) for name, got in rounds.items()}


def main(argv: list[str] | None = None) -> None:
    """Measure the relays side by side and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--streams", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--probes", type=int, default=300)
    parser.add_argument("--nginx", action="store_true", help="also nginx, a compiled relay")
    asyncio.run(_run(parser.parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
