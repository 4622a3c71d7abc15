"""Phase 1, capacity: ``streams`` requests run at once on the backend while ``queued`` more
from ``users`` users wait in fairq's queue; memory, stalls and terminal events measured."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from fairq_bench.load.children import start_fairq, start_sim
from fairq_bench.load.driver import Outcome, Spec, Tally, channels, prompt_for, send
from fairq_bench.load.metrics import fairq_quiet, scrape, total
from fairq_bench.load.prober import Prober, ProbeStats
from fairq_bench.load.sizes import (
    ADMISSION_WINDOW,
    MODEL,
    PROFILE,
    SHORT_TOKENS,
    LoadSize,
)
from fairq_sim.profiles import PROFILES

__all__ = ["CapacityResult", "capacity"]


@dataclass
class CapacityResult:
    """Figures of the capacity phase."""

    size: LoadSize
    tally: Tally
    peak_in_flight: float = 0.0
    peak_backend_running: float = 0.0
    peak_queue_depth: float = 0.0
    rss_idle: int = 0
    rss_streams: int = 0
    rss_queued: int = 0
    queue_fill_seconds: float = 0.0
    stream_start_seconds: float = 0.0
    total_seconds: float = 0.0
    fairq_cpu_seconds: float = 0.0
    server_outcomes: float = 0.0
    probe: ProbeStats | None = None
    probe_queue_fill: ProbeStats | None = None
    quiet_after: bool = False
    first_wave_seconds: float = math.nan
    #: fairq's own fairq_event_loop_lag_seconds over the run (after the warm-up): ticks, ticks
    #: late by more than 50 ms, 100 ms and 1 s.
    lag_ticks: float = 0.0
    lag_over_50ms: float = 0.0
    lag_over_100ms: float = 0.0
    lag_over_1s: float = 0.0
    #: fairq_gc_pause_seconds over the run: full passes, and passes of any generation over 50 ms.
    gc_full_passes: float = 0.0
    gc_passes_over_50ms: float = 0.0

    @property
    def bytes_per_queued(self) -> float:
        """fairq's resident memory per queued request."""
        return (self.rss_queued - self.rss_streams) / max(1, self.size.queued)

    @property
    def bytes_per_stream(self) -> float:
        """fairq's resident memory per running stream (over the idle process)."""
        return (self.rss_streams - self.rss_idle) / max(1, self.size.streams)


def _step_seconds(streams: int, speed: float) -> float:
    profile = PROFILES[PROFILE]
    return (profile.alpha + profile.beta * streams) / speed


def _capacity_config(size: LoadSize, sim_url: str) -> str:
    # The gate's pacing is not under test here: thresholds are opened wide and the backend
    # is capped by max_in_flight, so exactly `streams` run and the rest wait in fairq.
    return (
        'listen = "127.0.0.1:0"\n'
        "[scheduler]\n"
        "stale_after_seconds = 5.0\n"
        f"max_queued_per_user = {size.queued + size.streams}\n"
        f"max_queued_total = {size.queued + size.streams}\n"
        "queue_ttl_seconds = 3600.0\n"
        '[[tiers]]\nname = "interactive"\n'
        f"max_backend_waiting = {10 * (size.queued + size.streams)}\n"
        "tpot_limit_seconds = 3600.0\n"
        "[[backends]]\n"
        f'id = "sim"\nkind = "vllm"\nbase_url = "{sim_url}"\nmodels = ["{MODEL}"]\n'
        f"max_in_flight = {size.streams}\n"
    )


async def _watch(
    client: httpx.AsyncClient,
    urls: tuple[str, str],
    result: CapacityResult,
    log: Callable[[str], None],
) -> None:
    """Track the peaks of fairq's in-flight count and queue depth, and of the simulator's
    running count (``urls``: fairq's and the simulator's ``/metrics``); log every 10 s."""
    last_log = time.monotonic()
    while True:
        samples = await scrape(client, urls[0])
        in_flight = total(samples, "fairq_backend_in_flight")
        depth = total(samples, "fairq_queue_depth")
        result.peak_in_flight = max(result.peak_in_flight, in_flight)
        result.peak_queue_depth = max(result.peak_queue_depth, depth)
        running = total(await scrape(client, urls[1]), "vllm:num_requests_running")
        result.peak_backend_running = max(result.peak_backend_running, running)
        if time.monotonic() - last_log >= 10:
            last_log = time.monotonic()
            p = result.tally.progress
            log(
                f"  fairq in flight {in_flight:.0f}, queued {depth:.0f}; client saw "
                f"{p['queued']} queued, {p['started']} started, "
                f"{sum(result.tally.codes.values())} ended: {dict(result.tally.codes)}"
            )
        await asyncio.sleep(0.25)  # sampling another process's gauges


async def _until_queued(
    client: httpx.AsyncClient, url: str, queued: int, result: CapacityResult
) -> None:
    """Scrape fairq (``url``) until its queue depth reads ``queued`` (recorded in the peak),
    for at most 60 s: past that the run goes on and the peak shows what was reached."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(60):
            while True:
                depth = total(await scrape(client, url), "fairq_queue_depth")
                result.peak_queue_depth = max(result.peak_queue_depth, depth)
                if depth >= queued:
                    return
                await asyncio.sleep(0.05)  # polling another process's gauge


async def capacity(size: LoadSize, log: Callable[[str], None] = print) -> CapacityResult:
    """Run ``size.streams`` streams at once with ``size.queued`` requests queued behind them."""
    step = _step_seconds(size.streams, size.speed)
    hold_tokens = max(SHORT_TOKENS + 1, math.ceil(size.hold_seconds / step))
    block = PROFILES[PROFILE].block_size
    kv_blocks = math.ceil(size.streams * (hold_tokens + 64) / block * 1.5)
    result = CapacityResult(size, Tally())
    sim = await start_sim(
        "--profile",
        PROFILE,
        "--max-num-seqs",
        str(size.streams + 16),
        "--kv-blocks",
        str(kv_blocks),
        "--speed",
        str(size.speed),
    )
    fairq = await start_fairq(_capacity_config(size, sim.address), metrics=True)
    prober = await Prober.start(fairq.address)
    chans = channels(fairq.address, size.channels)
    tasks: list[asyncio.Task[Outcome]] = []
    helpers: list[asyncio.Task[None]] = []  # the watcher and the first-wave marker
    try:
        async with httpx.AsyncClient() as http:
            warm = Tally()
            await asyncio.gather(
                *(
                    send(chans[i % len(chans)], Spec(f"warm-{i}", 2), warm, prompt_for("warm", i))
                    for i in range(50)
                )
            )
            result.rss_idle = fairq.rss_bytes()
            cpu0, t0 = fairq.cpu_seconds(), time.monotonic()
            before = await scrape(http, fairq.metrics_url)  # start-up and warm-up left out
            urls = (fairq.metrics_url, sim.address + "/metrics")
            helpers.append(asyncio.create_task(_watch(http, urls, result, log)))
            log(
                f"capacity: {size.streams} streams of {hold_tokens} tokens "
                f"(~{hold_tokens * step:.0f} s each)"
            )
            admission = asyncio.Semaphore(ADMISSION_WINDOW)

            def launch(i: int, spec: Spec) -> None:
                chan = chans[i % len(chans)]
                prompt = prompt_for(spec.user, i)
                tasks.append(asyncio.create_task(send(chan, spec, result.tally, prompt, admission)))

            for i in range(size.streams):
                launch(i, Spec(f"user-{i % size.users}", hold_tokens))
            await result.tally.wait_for("started", size.streams, timeout=300)
            if size.hold_while_filling:
                # Every stream on the engine (its first token came), then no more tokens:
                # none can end before the queue is full.
                await result.tally.wait_for("streaming", size.streams, timeout=300)
                sim.signal(signal.SIGUSR1)
            result.stream_start_seconds = time.monotonic() - t0
            result.rss_streams = fairq.rss_bytes()
            log(
                f"capacity: {size.streams} running after {result.stream_start_seconds:.1f} s; "
                f"queueing {size.queued} from {size.users} users"
            )

            async def first_wave() -> None:
                await result.tally.wait_for("started", size.streams + 1, timeout=3600)
                result.first_wave_seconds = time.monotonic() - t0

            helpers.append(asyncio.create_task(first_wave()))
            t_fill = time.monotonic()
            for i in range(size.queued):
                launch(size.streams + i, Spec(f"user-{i % size.users}", SHORT_TOKENS))
            await result.tally.wait_for("answered", size.streams + size.queued, timeout=600)
            result.queue_fill_seconds = time.monotonic() - t_fill
            if size.hold_while_filling:
                try:
                    await _until_queued(http, fairq.metrics_url, size.queued, result)
                finally:
                    sim.signal(signal.SIGUSR2)
            result.rss_queued = fairq.rss_bytes()
            fill_end = time.monotonic()
            if result.tally.progress["started"] > size.streams:
                log(
                    "capacity: WARNING: streams ended before the queue was full; raise hold_seconds"
                )
            log(
                f"capacity: {size.queued} queued in {result.queue_fill_seconds:.1f} s; "
                f"RSS {result.rss_streams / 2**20:.0f} -> {result.rss_queued / 2**20:.0f} MiB; "
                "draining"
            )
            await asyncio.gather(*tasks)
            result.total_seconds = time.monotonic() - t0
            result.fairq_cpu_seconds = fairq.cpu_seconds() - cpu0
            for helper in helpers:
                helper.cancel()
            samples = await fairq_quiet(http, fairq)
            result.quiet_after = True

            def delta(name: str, **labels: str) -> float:
                return total(samples, name, **labels) - total(before, name, **labels)

            lag = "fairq_event_loop_lag_seconds"
            result.lag_ticks = delta(f"{lag}_count")

            def late_over(le: str) -> float:
                return result.lag_ticks - delta(f"{lag}_bucket", le=le)

            result.lag_over_50ms = late_over("0.05")
            result.lag_over_100ms = late_over("0.1")
            result.lag_over_1s = late_over("1.0")
            gc_pause = "fairq_gc_pause_seconds"
            result.gc_full_passes = delta(f"{gc_pause}_count", generation="2")
            result.gc_passes_over_50ms = delta(f"{gc_pause}_count") - delta(
                f"{gc_pause}_bucket", le="0.05"
            )
            # fairq's own count of finalized requests, minus the warm-up ones.
            served = total(samples, "fairq_requests_total")
            result.server_outcomes = served - sum(warm.codes.values())
        await prober.stop()
        result.probe = prober.stats(t0, t0 + result.total_seconds)
        result.probe_queue_fill = prober.stats(t_fill, fill_end)
    finally:
        for task in [*tasks, *helpers]:
            task.cancel()
        await asyncio.gather(*tasks, *helpers, return_exceptions=True)
        for chan in chans:
            await chan.close()
        await prober.stop()
        await fairq.stop()
        await sim.stop()
    return result
