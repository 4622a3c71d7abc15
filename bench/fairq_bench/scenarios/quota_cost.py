"""What quota and budget checks add to the request path, end to end, in paired samples.

Two ``fairq serve`` processes side by side on one simulated vLLM (its own CPU): **limits**,
configured as an organisation would (the configuration of the ``soft-quota`` scenario: a soft
tokens-per-minute quota, hard token quotas and daily and monthly budgets on team A, a
requests-per-minute quota on every user), and **none**, the same keys, teams and prices
without ``[[quotas]]`` or ``[[budgets]]``. Every limit is far from reached, so each request
pays every check (admission, the band's check, the reservation, the settlement) and nothing
else differs.

After ``WARMUP`` requests through each, ``PAIRS`` pairs: one request (``in1``, one output
token) through one process, then one through the other, the order alternating pair by pair,
so the machine's load at that moment weighs on both halves of a pair alike. Reported: the
median of the paired differences (limits minus none) with a bootstrap 95 % interval, for the
TTFT the client saw and for the TTFT fairq measured itself (from receipt to first chunk, its
``Finished`` event: no client or network time in it), and each process's CPU per request from
``/proc/<pid>/stat`` with its idle CPU (backend scrapes, the per-second gauge refresh)
measured over ``IDLE_SECONDS`` before the pairs and subtracted. The once-a-second store write
of the day's and month's amounts happens only when requests changed them, so it stays in.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from fairq import AsyncClient, Chunk, Finished
from fairq_bench.processes import (
    confined,
    cpu_seconds,
    fairq_module_process,
    sim_process,
    split_cpus,
)
from fairq_bench.report import markdown_table, percentile
from fairq_bench.scenarios.common import api_key
from fairq_bench.scenarios.docs import RESULT_PREFIX
from fairq_bench.scenarios.soft_quota import COST_BOUND_MS, config_text
from fairq_bench.targets import free_port

__all__ = ["Paired", "bootstrap_median", "quota_cost"]

WARMUP = 100
PAIRS = 1500
IDLE_SECONDS = 10.0
NAMES = ("limits", "none")


def bootstrap_median(
    diffs: Sequence[float], resamples: int = 4000, seed: int = 1
) -> tuple[float, float, float]:
    """Median of ``diffs`` and a percentile-bootstrap 95 % interval of it."""
    rng = random.Random(seed)
    n = len(diffs)
    medians = sorted(statistics.median(rng.choices(diffs, k=n)) for _ in range(resamples))
    return (
        statistics.median(diffs),
        medians[int(0.025 * resamples)],
        medians[int(0.975 * resamples) - 1],
    )


@dataclass
class Paired:
    """Per process: client TTFTs, fairq's own TTFTs (ms), CPU per request (ms)."""

    client: dict[str, list[float]] = field(default_factory=lambda: {n: [] for n in NAMES})
    server: dict[str, list[float]] = field(default_factory=lambda: {n: [] for n in NAMES})
    cpu_ms: dict[str, float] = field(default_factory=dict)
    idle_ms_per_s: dict[str, float] = field(default_factory=dict)
    failed: int = 0

    def diffs(self, which: dict[str, list[float]]) -> list[float]:
        """Limits minus none, pair by pair."""
        return [a - b for a, b in zip(which["limits"], which["none"], strict=True)]


async def _one(client: AsyncClient) -> tuple[float, float]:
    """One request of one output token: (client TTFT, fairq's TTFT), in ms."""
    started = time.perf_counter()
    first = 0.0
    events = client.generate("sim", "one token, please", max_tokens=1, ignore_eos=True)
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, Chunk) and not first:
                first = (time.perf_counter() - started) * 1000
            elif isinstance(event, Finished):
                return first, event.ttft_seconds * 1000
    raise RuntimeError("stream ended without Finished")


async def _measure() -> Paired:
    res = Paired()
    pairs = PAIRS
    sim_cpus, other_cpus = split_cpus()
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(sim_process("--max-num-seqs", "4", cpus=sim_cpus))
        stack.enter_context(confined(other_cpus))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        started = await asyncio.gather(
            *(
                stack.enter_async_context(
                    fairq_module_process(
                        config_text(url, tmp / f"{n}.db", free_port(), n == "limits")
                    )
                )
                for n in NAMES
            )
        )
        clients, pids = {}, {}
        for name, (proc, target) in zip(NAMES, started, strict=True):
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(target))
            clients[name] = AsyncClient("", api_key=api_key("in1"), channel=channel)
            pids[name] = proc.pid

        async def one(name: str) -> tuple[float, float]:
            while True:
                try:
                    return await _one(clients[name])
                except Exception as exc:  # e.g. a scrape timing out on a loaded machine
                    res.failed += 1
                    if res.failed <= 3:
                        print(f"  {name}: {type(exc).__name__}: {exc}", flush=True)
                    await asyncio.sleep(0.5)

        for _ in range(WARMUP):
            for name in NAMES:
                await one(name)
        idle0 = {n: cpu_seconds(p) for n, p in pids.items()}
        t0 = time.monotonic()
        await asyncio.sleep(IDLE_SECONDS)
        idle_s = time.monotonic() - t0
        res.idle_ms_per_s = {
            n: (cpu_seconds(p) - idle0[n]) * 1000 / idle_s for n, p in pids.items()
        }
        print(f"  idle CPU ms/s: {res.idle_ms_per_s}; {pairs} pairs", flush=True)
        cpu0 = {n: cpu_seconds(p) for n, p in pids.items()}
        t0 = time.monotonic()
        for i in range(pairs):
            for name in NAMES if i % 2 == 0 else NAMES[::-1]:
                client_ms, server_ms = await one(name)
                res.client[name].append(client_ms)
                res.server[name].append(server_ms)
        wall = time.monotonic() - t0
        res.cpu_ms = {
            n: ((cpu_seconds(p) - cpu0[n]) * 1000 - res.idle_ms_per_s[n] * wall) / pairs
            for n, p in pids.items()
        }
    return res


def _page(res: Paired) -> tuple[str, bool]:
    client = bootstrap_median(res.diffs(res.client))
    server = bootstrap_median(res.diffs(res.server))
    cpu_added = res.cpu_ms["limits"] - res.cpu_ms["none"]
    n = len(res.client["limits"])
    rows = []
    for label, which, (med, lo, hi) in (
        ("TTFT at the client", res.client, client),
        ("TTFT in fairq (receipt to first chunk)", res.server, server),
    ):
        p50 = [percentile(which[name], 50) for name in ("none", "limits")]
        rows.append([label, *(f"{v:.3f}" for v in p50), f"{med:+.3f}", f"{lo:+.3f} .. {hi:+.3f}"])
    cpu_rows = [
        [name, f"{res.idle_ms_per_s[name]:.1f}", f"{res.cpu_ms[name]:.3f}"] for name in NAMES
    ]
    cpu_rows.append(["difference", "", f"{cpu_added:+.3f}"])
    # The bound is on TTFT p50; fairq's own TTFT is the witness with no client noise in it.
    ok = server[0] <= COST_BOUND_MS and client[0] <= COST_BOUND_MS
    result = (
        f"quotas and budgets added {server[0]:+.3f} ms (95 % CI {server[1]:+.3f} .. "
        f"{server[2]:+.3f}) to the TTFT fairq measured and {client[0]:+.3f} ms "
        f"({client[1]:+.3f} .. {client[2]:+.3f}) to the client's, medians of {n} paired "
        f"differences (bound {COST_BOUND_MS:g} ms), and {cpu_added:+.3f} ms of fairq's CPU per "
        "request"
    )
    page = (
        "# The cost of quota and budget checks, end to end\n\n"
        + (__doc__ or "").split("\n\n", 1)[1]
        + f"\nHere: WARMUP {WARMUP}, PAIRS {n}, IDLE_SECONDS {IDLE_SECONDS:g}.\n\n"
        + markdown_table(
            [
                "TTFT (ms)",
                "p50 none",
                "p50 limits",
                "median of paired differences",
                "bootstrap 95 % interval",
            ],
            rows,
        )
        + "\n\n"
        + markdown_table(
            ["process", "idle CPU (ms per s)", "CPU per request, idle subtracted (ms)"], cpu_rows
        )
        + f"\n\nRequests that failed and were sent again: {res.failed or 'none'}.\n\n"
        + f"{RESULT_PREFIX} {result}.\n\n"
        + "Reproduce: `uv run fairq bench quota-cost --write-docs` (about 2.5 minutes; "
        "`--quick` skips it).\n"
    )
    return page, ok


async def quota_cost(args: argparse.Namespace, url: str, out: Path) -> bool:
    """Scenario ``quota-cost``: paired TTFT differences with and without the limits."""
    if args.quick:
        # Two more fairq processes and a simulator take about 40 s to start and warm on the
        # reference machine, and 150 pairs do not resolve 0.1 ms: not worth CI's time.
        print("  skipped in --quick (the full run: about 2.5 minutes)", flush=True)
        return True
    res = await _measure()
    page, ok = _page(res)
    (out / "quota-cost.md").write_text(page)
    print(page, flush=True)
    return ok
