"""``python -m fairq_bench.hot_path.first_flood``: is a fresh fairq's first flood slower?

In interleaved real-vLLM runs the first flood through a fresh fairq was once slower than the
second (makespan 7.9 s against 6.3 s, light TTFT 0.59 s against 0.14 s). This separates the
two suspects:

- **fairq alone**: fresh ``fairq serve`` processes in front of the zero-cost backend
  (``--backend firehose``, nothing to warm up there), each sent the same flood twice. What a
  fresh process does lazily (imports, connection pools, first scrapes, the TPOT window) shows
  as a first round slower than the second; the engine cannot.
- **with the engine warm**: against a running backend (``--backend URL``) that is first sent
  the flood directly (so it has compiled, allocated and cached what the flood needs), fresh
  fairq processes each sent the flood twice. If the first round is no longer slower, what was
  seen was the engine's warm-up, not fairq's.

Printed: per fresh process, each round's light-user TTFT p50 / max and power makespan, and the
medians of first / second over the processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
from collections.abc import AsyncIterator, Sequence

import grpc

from fairq_bench.flood import LIGHT, POWER, flood_workload
from fairq_bench.processes import child_process, confined, fairq_process, toml_config
from fairq_bench.report import markdown_table
from fairq_bench.targets import direct_sender, fairq_sender, http_client
from fairq_bench.workload import RequestResult, RequestSpec, replay

__all__ = ["main"]


def _figures(results: Sequence[RequestResult]) -> tuple[float, float, float]:
    """Light TTFT p50 and max, power makespan (seconds)."""
    light = [r.ttft for r in results if r.spec.user == LIGHT]
    power = [r for r in results if r.spec.user == POWER]
    makespan = max(r.done for r in power) - min(r.sent for r in power)
    return statistics.median(light), max(light), makespan


@contextlib.asynccontextmanager
async def _backend(where: str) -> AsyncIterator[str]:
    if where != "firehose":
        yield where
        return
    argv = ["-m", "fairq_bench.scenarios.firehose", "--step-ms", "10"]
    async with child_process(argv, r"^(http://\S+)") as (_, url):
        yield url


async def run(where: str, model: str, kind: str, processes: int, power: int) -> str:
    """Return the page's table: ``processes`` fresh fairq, two floods each."""
    specs: list[RequestSpec] = flood_workload(power_requests=power, light_requests=5)
    rows, firsts, seconds = [], [], []
    async with _backend(where) as url:
        if where != "firehose":
            async with http_client() as client:
                await replay(specs, direct_sender(client, url, model, kind))  # warm the engine
        for p in range(processes):
            async with (
                fairq_process(toml_config(url, model, kind)) as target,
                grpc.aio.insecure_channel(target) as channel,
            ):
                rounds = [_figures(await replay(specs, fairq_sender(channel, model)))]
                rounds.append(_figures(await replay(specs, fairq_sender(channel, model))))
            firsts.append(rounds[0])
            seconds.append(rounds[1])
            for i, (p50, worst, makespan) in enumerate(rounds):
                rows.append(
                    [str(p + 1), ("first", "second")[i], f"{p50:.3f}", f"{worst:.3f}",
                     f"{makespan:.2f}"]
                )  # fmt: skip
            print(f"  fresh fairq {p + 1}/{processes}: {rounds}", flush=True)
    for label, col in (("median, first", firsts), ("median, second", seconds)):
        rows.append([label, "", *(f"{statistics.median(c[k] for c in col):.3f}" for k in range(3))])
    head = ("fresh fairq", "round", "light TTFT p50 s", "light TTFT max s", "power makespan s")
    return markdown_table(head, rows)


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the arguments, run, print the table."""
    parser = argparse.ArgumentParser(prog="first_flood", description=__doc__)
    parser.add_argument("--backend", default="firehose", help="'firehose' or a backend URL")
    parser.add_argument("--model", default="sim")
    parser.add_argument("--kind", default="vllm")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--power", type=int, default=60, help="power requests per flood")
    parser.add_argument("--cpus", default="", help="run fairq and the load here, e.g. '1'")
    args = parser.parse_args(argv)
    cpus = {int(c) for c in args.cpus.split(",") if c}
    with confined(cpus):
        print(asyncio.run(run(args.backend, args.model, args.kind, args.processes, args.power)))


if __name__ == "__main__":
    main()
