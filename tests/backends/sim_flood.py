"""The power-user flood against the simulator, direct vs through fairq (child processes).

Sizes differ from the reference scenario (60 x 300 tokens, one light request at 0.5 s) to
keep a comparison near 15 s while keeping the ratios meaningful: 120 power requests of 100
tokens (the same 12k tokens as 40 x 300), ``tiny-cpu`` profile at speed 1, 4 slots. Through
fairq the light user waits for about one power request's duration (the backend's slots turn
over together, and fairq keeps at most 3 requests waiting in the backend), while behind the
backend's FIFO queue it waits for ``power_requests / max_num_seqs`` of them. The best
achievable TTFT ratio is therefore about ``max_num_seqs / power_requests`` plus fairq's poll
interval over the direct wait: 40 power requests could not reach 1/10 at all; 120 short ones
give 0.03-0.05, leaving room for noise. Speed 1 keeps the token rate (~2k tokens/s) low enough
that the run measures scheduling rather than CPU contention on a small shared machine.

The simulator runs on its own CPU and fairq with the load generator on the others (where the
machine has two or more), as separate hosts would: on shared cores, the three processes'
contention rather than scheduling decides the makespan.

Three light requests (0.5 s apart) are compared by their median TTFT, so one request
unlucky with the machine's noise does not decide the outcome. A comparison that misses
either bound is repeated once on fresh processes; both attempts are reported on failure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fairq_bench.flood import FloodComparison, compare_flood, flood_workload
from fairq_bench.processes import confined, sim_process, split_cpus
from fairq_bench.workload import RequestSpec

__all__ = ["SIZES", "FloodOutcome", "assert_fairq_protects_the_light_user", "workload"]

MODEL = "sim"
SPEED = 1.0
SLOTS = 4
SIZES = "120 power x 100 tokens; 3 light x 16 tokens at 0.5, 1.0, 1.5 s; tiny-cpu, speed 1, 4 slots"
LIGHT_TTFT_RATIO = 0.1
# Measured 0.98-1.04x (gRPC and HTTP doors, vLLM and TGI modes), idle or with a busy loop on
# the simulator's CPU; 1.30-1.37x through the HTTP door with the machine at load average 5-6.
# CI once measured 1.5-1.8x: the simulator lost engine time while it rendered /metrics for
# fairq's 50 ms polls (8 ms a render, more on a busy machine) and caught up only 10 ms of
# lateness; its engine now keeps time like a real engine in its own process
# (fairq_sim/runner.py). The makespan target (about 1.05x) is the benchmarks' to report; this
# bound catches a fairq that holds work back.
MAKESPAN_RATIO = 1.4
ATTEMPTS = 2
# Poll as the e2e tests do: the default 100 ms would add up to a poll interval to every
# dispatch decision, which is large next to a 0.2 s request.
_FAIRQ_CONFIG = "[scheduler]\npoll_interval_seconds = 0.05\n"


@dataclass(frozen=True)
class FloodOutcome:
    """One direct-vs-fairq comparison and its headline ratios (fairq / direct)."""

    comparison: FloodComparison
    light_ttft: float
    makespan: float

    @property
    def passed(self) -> bool:
        """Both bounds held."""
        return self.light_ttft <= LIGHT_TTFT_RATIO and self.makespan <= MAKESPAN_RATIO

    def describe(self) -> str:
        """The comparison table and the ratios."""
        return (
            f"{self.comparison.table()}\nlight TTFT p50 fairq/direct {self.light_ttft:.3f} "
            f"(bound {LIGHT_TTFT_RATIO}), power makespan fairq/direct {self.makespan:.3f} "
            f"(bound {MAKESPAN_RATIO}); {_machine()}"
        )


def _machine() -> str:
    """CPUs and load, for reading a failure."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{len(os.sched_getaffinity(0))} CPUs usable, load average {load}"


def workload() -> list[RequestSpec]:
    """The schedule described by :data:`SIZES`."""
    return flood_workload(
        power_requests=120,
        power_tokens=100,
        light_requests=3,
        light_tokens=16,
        light_start=0.5,
        light_every=0.5,
    )


async def run_flood(mode: str, door: str = "grpc") -> FloodOutcome:
    """Start a simulator in ``mode`` (``vllm`` or ``tgi``) and compare direct vs fairq."""
    args = ("--mode", mode, "--model", MODEL, "--max-num-seqs", str(SLOTS), "--speed", str(SPEED))
    sim_cpus, other_cpus = split_cpus()
    async with sim_process(*args, cpus=sim_cpus) as url:
        with confined(other_cpus):
            comparison = await compare_flood(
                url,
                MODEL,
                mode,
                workload(),
                fairq_extra_config=_FAIRQ_CONFIG,
                show_progress=False,
                door=door,
            )
    failed = [r for r in (*comparison.direct, *comparison.fairq) if r.error]
    # Failures are bugs, not noise: never retried.
    assert not failed, f"{len(failed)} requests failed, e.g. {failed[0].error}"
    ratios = comparison.ratios()
    return FloodOutcome(comparison, ratios["light_ttft_p50"], ratios["power_makespan"])


async def assert_fairq_protects_the_light_user(mode: str, door: str = "grpc") -> FloodOutcome:
    """Light TTFT through fairq <= 1/10 of direct, power makespan <= 1.4x direct.

    Returns:
        The passing comparison (printed by the caller for ``-s`` runs).
    """
    outcomes: list[FloodOutcome] = []
    for _ in range(ATTEMPTS):
        outcome = await run_flood(mode, door)
        outcomes.append(outcome)
        if outcome.passed:
            return outcome
    report = "\n\n".join(f"attempt {i + 1}:\n{o.describe()}" for i, o in enumerate(outcomes))
    raise AssertionError(
        f"fairq did not protect the light user ({mode} sim, {door} door):\n{report}"
    )
