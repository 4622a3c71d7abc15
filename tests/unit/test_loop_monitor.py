"""The event-loop lag monitor reports a callback that holds the loop as that much lag."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest
import uvloop

from fairq_server import loop_share, pace
from fairq_server.loop_monitor import LoopMonitor


async def test_a_callback_holding_the_loop_shows_as_lag() -> None:
    lags: asyncio.Queue[float] = asyncio.Queue()
    monitor = LoopMonitor(lags.put_nowait, interval=0.01)
    monitor.start()
    try:
        async with asyncio.timeout(5):
            await _stall_reported(lags)
    finally:
        await monitor.stop()


async def _stall_reported(lags: asyncio.Queue[float]) -> None:
    await lags.get()  # ticking
    asyncio.get_running_loop().call_soon(time.sleep, 0.3)  # holds the loop for 300 ms
    lag = await lags.get()
    while lag < 0.1:  # a tick already due before the blocking callback was queued
        lag = await lags.get()
    assert 0.25 <= lag < 1.0, lag


async def test_stopped_it_reports_nothing_more() -> None:
    lags: asyncio.Queue[float] = asyncio.Queue()
    monitor = LoopMonitor(lags.put_nowait, interval=0.001)
    monitor.start()
    async with asyncio.timeout(5):
        await lags.get()
    await monitor.stop()
    while not lags.empty():
        lags.get_nowait()
    await asyncio.sleep(0.05)  # fifty intervals: a tick still scheduled would have reported
    assert lags.empty()


def test_on_uvloop_a_tick_held_past_its_next_due_time_keeps_ticking() -> None:
    # uvloop schedules a time already past as a plain Handle (no ``when()``): a tick held
    # longer than an interval used to raise there and stop the monitor for good.
    errors: list[dict[str, object]] = []
    lags: list[float] = []

    async def run() -> None:
        ten = asyncio.Event()

        def observe(lag: float) -> None:
            if len(lags) == 2:
                time.sleep(0.02)  # the next due time is past before it is scheduled
            lags.append(lag)
            if len(lags) == 10:
                ten.set()

        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: errors.append(ctx))
        monitor = LoopMonitor(observe, interval=0.005)
        monitor.start()
        async with asyncio.timeout(5):
            await ten.wait()
        await monitor.stop()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())
    assert not errors, errors
    assert len(lags) >= 10


async def test_a_busy_loop_stretches_the_window_and_an_idle_one_restores_it() -> None:
    samples: asyncio.Queue[tuple[float, float]] = asyncio.Queue()
    monitor = LoopMonitor(lambda _: None, interval=0.01, report=lambda *s: samples.put_nowait(s))
    loop = asyncio.get_running_loop()
    monitor.start()
    busy = True

    def spin() -> None:  # holds the loop 5 ms per pass, the ticks still run in between
        end = time.perf_counter() + 0.005
        while time.perf_counter() < end:
            pass
        if busy:
            loop.call_soon(spin)

    try:
        async with asyncio.timeout(10):
            loop.call_soon(spin)
            load, stretch = await samples.get()
            while stretch < pace.MAX_STRETCH * 0.9:
                load, stretch = await samples.get()
            assert load > pace.FULL
            assert pace.for_loop().stretch == stretch  # what the outboxes and readers read
            busy = False
            while stretch > 1.0:
                load, stretch = await samples.get()
            assert load < pace.HALF
    finally:
        await monitor.stop()
    assert pace.for_loop().stretch == 1.0


async def test_bulk_work_waiting_for_a_later_pass_counts_as_load() -> None:
    """Where CPU time understates the load (the core is shared), the backlog shows it."""
    samples: list[float] = []
    monitor = LoopMonitor(lambda _: None, report=lambda load, _: samples.append(load))
    loop = asyncio.get_running_loop()
    seen_behind = False

    def off_cpu() -> None:  # holds the loop without its CPU, as when another process runs
        time.sleep(0.002)

    async def bulk() -> None:
        nonlocal seen_behind
        await loop_share.turn()
        seen_behind = seen_behind or loop_share.backlogged(loop)
        off_cpu()

    monitor.start()
    try:
        async with asyncio.timeout(10):
            while len(samples) < 3:
                await asyncio.gather(*(bulk() for _ in range(40)))
    finally:
        await monitor.stop()
    assert seen_behind
    assert not loop_share.backlogged(loop)  # all taken
    assert max(samples) > 0.5, samples


@pytest.mark.skipif(not Path("/proc/thread-self/schedstat").exists(), reason="Linux schedstat")
async def test_a_loop_waiting_for_its_core_counts_as_busy() -> None:
    """Beside a busy process on its core the loop runs half the time and never rests: load ~1.

    Its CPU time over the wall time says the core's share (about half) instead: the window
    stretched only half way on a shared core (the cause of this file's busy-loop test failing
    on a loaded machine).
    """
    samples: list[float] = []
    eight = asyncio.Event()

    def report(load: float, _stretch: float) -> None:
        samples.append(load)
        if len(samples) == 8:
            eight.set()

    monitor = LoopMonitor(lambda _: None, interval=0.01, report=report)
    loop = asyncio.get_running_loop()
    core = min(os.sched_getaffinity(0))
    pinned = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})  # this thread (the loop's) only
    hog = await asyncio.create_subprocess_exec(
        sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    )
    busy = True

    def spin() -> None:
        end = time.perf_counter() + 0.005
        while time.perf_counter() < end:
            pass
        if busy:
            loop.call_soon(spin)

    try:
        loop.call_soon(spin)
        cpu, wall = time.thread_time(), time.monotonic()
        monitor.start()
        async with asyncio.timeout(30):
            await eight.wait()
        share = (time.thread_time() - cpu) / (time.monotonic() - wall)
    finally:
        busy = False
        await monitor.stop()
        hog.kill()
        await hog.wait()
        os.sched_setaffinity(0, pinned)
    assert share < 0.8, share  # the core was shared: the CPU time alone would say so
    assert min(samples[1:]) > pace.FULL, (samples, share)
