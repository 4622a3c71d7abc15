"""``python -m fairq_bench.scenarios.scrape_cost``: what watching the engine costs the engine.

fairq reads every backend's ``/metrics`` every ``poll_interval_seconds`` (0.5 s), once per
replica. vLLM renders that text on the core its engine runs on, so each scrape takes engine
time. This sends the same flood straight to a running vLLM three ways, round after round in a
rotating order (the machine's drift falls on all three alike):

- **unwatched**: nobody scrapes;
- **whole**: ``/metrics`` read every interval, as fairq did (the whole exposition, ~50 kB);
- **by name**: ``/metrics/?name[]=...`` every interval, the samples fairq reads only (what
  it does now; ``docs/design/scraping.md``).

Reported per way, medians over rounds: the flood's makespan against the same round's
unwatched run, the engine's time per token (vLLM's inter-token latency over the run), and
each scrape's time and size as the watcher saw them. ``--write-docs`` writes
``docs/benchmarks/scrape-cost.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yarl

from fairq_bench.report import markdown_table, percentile
from fairq_bench.scenarios.preemption import flood_of_many
from fairq_bench.targets import direct_sender, http_client
from fairq_bench.workload import replay
from fairq_server.backends.metrics import filtered_url
from fairq_server.backends.vllm import VllmBackend

__all__ = ["main"]

WAYS = ("unwatched", "whole", "by name")
_STEP = "vllm:inter_token_latency_seconds"


@dataclass
class Run:
    """One flood sent one way."""

    makespan: float
    step: float
    scrape_seconds: list[float] = field(default_factory=list)
    scrape_bytes: list[int] = field(default_factory=list)


def _sum(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def _step_counts(client: httpx.AsyncClient, base: str) -> tuple[float, float]:
    text = (await client.get(f"{base}/metrics")).text
    return _sum(text, f"{_STEP}_sum"), _sum(text, f"{_STEP}_count")


async def _watch(client: httpx.AsyncClient, url: str, interval: float, run: Run) -> None:
    """Scrape ``url`` every ``interval`` seconds (from the start of the last) until cancelled."""
    while True:
        started = time.monotonic()
        answer = await client.get(url)
        run.scrape_seconds.append(time.monotonic() - started)
        run.scrape_bytes.append(len(answer.content))
        await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))


async def run_once(base: str, model: str, way: str, per_user: int, interval: float) -> Run:
    """Send the flood straight to ``base`` while watching it ``way``."""
    urls = {
        "whole": f"{base}/metrics",
        "by name": str(filtered_url(yarl.URL(f"{base}/metrics/"), VllmBackend.metrics_filter)),
    }
    specs = flood_of_many(per_user=per_user, light=0)
    async with http_client() as client, http_client() as watcher:
        before = await _step_counts(client, base)
        run = Run(0.0, 0.0)
        watching = (
            asyncio.create_task(_watch(watcher, urls[way], interval, run)) if way in urls else None
        )
        try:
            results = await replay(specs, direct_sender(client, base, model, "vllm"))
        finally:
            if watching is not None:
                watching.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watching
        after = await _step_counts(client, base)
    failed = [r.error for r in results if r.error]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed, first: {failed[0]}")
    run.makespan = max(r.done for r in results)
    steps = after[1] - before[1]
    run.step = (after[0] - before[0]) / steps if steps else float("nan")
    return run


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far (``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def cpu_per_scrape(base: str, pid: int, blocks: int = 6, per_block: int = 50) -> str:
    """The engine's API server's CPU time per scrape, each way, the engine idle.

    Blocks of scrapes alternate between the two ways; per block the process's CPU time over
    it (its idle cost for the block's wall time taken off, measured in a pause of the same
    length) divided by the scrapes. Medians over blocks.
    """
    urls = {
        "whole": f"{base}/metrics",
        "by name": str(filtered_url(yarl.URL(f"{base}/metrics/"), VllmBackend.metrics_filter)),
    }
    per: dict[str, list[float]] = {w: [] for w in urls}
    async with http_client() as client:
        for _ in range(blocks):
            for way, url in urls.items():
                cpu, wall = _cpu_seconds(pid), time.monotonic()
                for _ in range(per_block):
                    (await client.get(url)).raise_for_status()
                used, wall = _cpu_seconds(pid) - cpu, time.monotonic() - wall
                cpu = _cpu_seconds(pid)
                await asyncio.sleep(wall)  # the same wall time with no scrape: the idle cost
                idle = _cpu_seconds(pid) - cpu
                per[way].append(max(0.0, used - idle) / per_block)
    rows = [
        [way, f"{statistics.median(v) * 1000:.2f}", f"{min(v) * 1000:.2f}-{max(v) * 1000:.2f}"]
        for way, v in per.items()
    ]
    header = ["scraped", "API server CPU ms per scrape (median)", "range over blocks"]
    return (
        f"The API server's own CPU time per scrape, the engine idle ({blocks} blocks of "
        f"{per_block} scrapes each way, alternating; the idle cost of the same wall time "
        "taken off):\n\n" + markdown_table(header, rows)
    )


def _result(runs: dict[str, list[Run]]) -> str:
    """The page's one-line result: each watched way's makespan against unwatched."""
    alone = runs["unwatched"]
    parts = []
    for way in WAYS[1:]:
        ratios = [r.makespan / a.makespan for r, a in zip(runs[way], alone, strict=True)]
        steps = [r.step / a.step for r, a in zip(runs[way], alone, strict=True)]
        parts.append(
            f"{way}: flood makespan {statistics.median(ratios):.3f}x unwatched, engine time "
            f"per token {statistics.median(steps):.3f}x"
        )
    return "; ".join(parts)


def _table(runs: dict[str, list[Run]]) -> str:
    alone = runs["unwatched"]
    rows = []
    for way in WAYS:
        mine = runs[way]
        ratios = [r.makespan / a.makespan for r, a in zip(mine, alone, strict=True)]
        step_ratios = [r.step / a.step for r, a in zip(mine, alone, strict=True)]
        seconds = [s for r in mine for s in r.scrape_seconds]
        sizes = [b for r in mine for b in r.scrape_bytes]
        rows.append([
            way,
            f"{statistics.median(r.makespan for r in mine):.2f}",
            f"{statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f})",
            f"{statistics.median(r.step for r in mine) * 1000:.2f}",
            f"{statistics.median(step_ratios):.3f}x",
            f"{percentile(seconds, 50) * 1000:.1f} / {percentile(seconds, 99) * 1000:.1f}"
            if seconds else "-",
            f"{statistics.median(sizes):,.0f}" if sizes else "-",
            str(len(seconds)),
        ])  # fmt: skip
    header = [
        "watched", "makespan s", "vs unwatched (range)", "engine ms/token",
        "vs unwatched", "scrape p50 / p99 ms", "bytes per scrape", "scrapes",
    ]  # fmt: skip
    return markdown_table(header, rows)


def _page(
    args: argparse.Namespace, result: str, table: str, cpu: str, load: tuple[float, float]
) -> str:
    return f"""# What watching the engine costs the engine

**Result:** scraping every {args.interval} s, {result}.

vLLM renders `/metrics` in its API server process, on the core its engine runs on. The flood
({3 * args.per_user} requests of 300 tokens from three users at t=0, straight to the engine)
is sent {args.rounds} times each way, the order rotating every round, medians over rounds;
the watcher scrapes every {args.interval} s ({1 / args.interval:.0f} scrapes a second: fairq
scrapes every 0.5 s per process, so this is {0.5 / args.interval:.0f} replicas, or one process
polling that often). "vs unwatched" is the median over rounds of each round's ratio to that
round's unwatched run; the scrapes' times are the watcher's (the engine busy with the flood).

{table}

{cpu}

Engine: {args.describe}. Machine load average {load[0]:.1f} at the start and {load[1]:.1f} at
the end (2 cores, shared): compare rows, not runs.

Reproduce: `uv run --frozen python -m fairq_bench.scenarios.scrape_cost --backend URL --model
tiny --interval {args.interval} --pid PID --write-docs`, against a running vLLM whose API
server is process PID, the engine alone on one core and the command on the other
(`docs/design/scraping.md`).
"""


async def _main(args: argparse.Namespace) -> int:
    base = args.backend.rstrip("/")
    runs: dict[str, list[Run]] = {w: [] for w in WAYS}
    load_start = os.getloadavg()[0]
    print("warm-up round", flush=True)
    await run_once(base, args.model, "unwatched", args.per_user, args.interval)
    for i in range(args.rounds):
        order = WAYS[i % 3 :] + WAYS[: i % 3]
        for way in order:
            run = await run_once(base, args.model, way, args.per_user, args.interval)
            runs[way].append(run)
            print(
                f"round {i + 1}/{args.rounds} {way:>9}: makespan {run.makespan:.2f} s, "
                f"{run.step * 1000:.2f} ms/token, {len(run.scrape_seconds)} scrapes",
                flush=True,
            )
    table = _table(runs)
    print(table)
    cpu = ""
    if args.pid:
        print("CPU per scrape, engine idle", flush=True)
        cpu = await cpu_per_scrape(base, args.pid)
        print(cpu)
    if args.write_docs:
        page = _page(args, _result(runs), table, cpu, (load_start, os.getloadavg()[0]))
        out = Path(args.docs) / "scrape-cost.md"
        out.write_text(page)
        print(f"wrote {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True, help="a running vLLM, e.g. http://h:8000")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-user", type=int, default=8, help="requests per power user")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between scrapes")
    parser.add_argument(
        "--pid", type=int, default=0, help="vLLM's API server process: measure CPU per scrape"
    )
    parser.add_argument("--describe", default="vLLM 0.32 (CPU build), tiny model, on core 0")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--docs", default="docs/benchmarks")
    return asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
