"""What coordination costs: TTFT added per dispatch, and aggregate relay throughput.

* Added TTFT: one replica, unloaded backend, short requests one after the other, with and
  without ``[cluster]``: the difference is the reservation round trip (plus the task hop).
* Throughput: a wide simulated backend (256 slots, fast profile) flooded through 1 replica
  alone, 1 replica with Redis and 3 replicas with Redis. On a 2-core machine the replicas,
  Redis, the simulator and the load generator share the same cores, so this shows the
  overhead, not a speed-up.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from fairq_bench.cluster.setup import by_replica, running_cluster
from fairq_bench.report import markdown_table, percentile
from fairq_bench.workload import RequestSpec, replay

__all__ = ["CostResult", "cost_markdown", "run_cost"]


@dataclass(frozen=True)
class CostResult:
    """TTFT percentiles without and with Redis; throughput per setup."""

    ttft_alone: tuple[float, float]
    ttft_shared: tuple[float, float]
    throughput: list[tuple[str, float]]


async def _ttfts(coordinated: bool, n: int) -> tuple[float, float]:
    async with running_cluster(1, coordinated, max_num_seqs=8) as cluster:
        out = []
        for i in range(n):
            spec = RequestSpec("solo", f"q{i}", 2)
            start = time.monotonic()
            first = None
            async for _ in cluster.senders[0](spec):
                if first is None:
                    first = time.monotonic() - start
            out.append(first if first is not None else float("nan"))
    return percentile(out, 50), percentile(out, 99)


async def _throughput(replicas: int, coordinated: bool, n: int) -> float:
    async with running_cluster(replicas, coordinated, max_num_seqs=256, threshold=64) as cluster:
        specs = [RequestSpec(f"u{i % 8}", f"p{i}", 200) for i in range(n)]
        start = time.monotonic()
        results = await replay(specs, by_replica(cluster.senders, {}))
        elapsed = time.monotonic() - start
    return sum(r.spec.max_tokens for r in results if not r.error) / elapsed


async def run_cost(*, quick: bool) -> CostResult:
    """Measure both, niced like everything else on a shared machine."""
    n = 40 if quick else 300
    # Interleaved runs would be fairer still; alone then shared, twice, keeps it simple.
    alone = await _ttfts(False, n)
    shared = await _ttfts(True, n)
    print(f"  TTFT p50/p99 alone {alone}, with Redis {shared}", flush=True)
    flood = 100 if quick else 600
    rows = []
    for label, replicas, coordinated in (("1 replica, no Redis", 1, False),
                                         ("1 replica, Redis", 1, True),
                                         ("3 replicas, Redis", 3, True)):  # fmt: skip
        rows.append((label, await _throughput(replicas, coordinated, flood)))
        print(f"  {label}: {rows[-1][1]:.0f} tokens/s", flush=True)
        await asyncio.sleep(0)
    return CostResult(alone, shared, rows)


def cost_markdown(result: CostResult) -> str:
    """Added TTFT and throughput, side by side."""
    (a50, a99), (s50, s99) = result.ttft_alone, result.ttft_shared
    ttft = markdown_table(
        ("TTFT, unloaded", "no Redis", "Redis (shared gate)", "added"),
        [
            (
                "p50",
                f"{a50 * 1000:.2f} ms",
                f"{s50 * 1000:.2f} ms",
                f"{(s50 - a50) * 1000:+.2f} ms",
            ),
            (
                "p99",
                f"{a99 * 1000:.2f} ms",
                f"{s99 * 1000:.2f} ms",
                f"{(s99 - a99) * 1000:+.2f} ms",
            ),
        ],
    )
    base = result.throughput[0][1] or 1.0
    tput = markdown_table(
        ("setup", "relayed tokens/s", "vs 1 replica without Redis"),
        [(label, f"{v:.0f}", f"{v / base:.2f}x") for label, v in result.throughput],
    )
    return (
        ttft
        + "\n\n"
        + tput
        + (
            "\n\nAll processes share the machine's 2 cores: 3 replicas show coordination's "
            "overhead, not the speed-up they would give on 3 machines."
        )
    )
