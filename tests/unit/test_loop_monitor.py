"""The event-loop lag monitor reports a callback that holds the loop as that much lag.

The monitor runs on a fake clock the tests move by hand (``tests/fakeclock.py``): a held loop
is time passing with no timer firing, a busy loop is time passing on the loop's CPU, and the
figures asserted are exact. One test runs on the real uvloop, whose timers are its subject.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest
import uvloop

from fairq_server.runtime import pace
from fairq_server.runtime.loop_monitor import LoopMonitor
from fairq_server.runtime.loop_tools import LoopTools
from tests.fakeclock import FakeClock


async def test_a_callback_holding_the_loop_shows_as_lag() -> None:
    clock = FakeClock()
    lags: list[float] = []
    monitor = LoopMonitor(lags.append, LoopTools(clock), interval=0.01)
    monitor.start()
    try:
        await clock.advance(0.01)
        assert lags == [0.0]  # on time
        clock.hold(0.3)  # a callback holds the loop for 300 ms: no timer fires meanwhile
        await clock.advance()
        assert lags[1:] == [pytest.approx(0.29)]  # the tick due 10 ms in, run 290 ms late
        await clock.advance(0.01)
        assert lags[2:] == [0.0]  # on time again, one interval after the late one
    finally:
        await monitor.stop()


async def test_stopped_it_reports_nothing_more() -> None:
    clock = FakeClock()
    lags: list[float] = []
    monitor = LoopMonitor(lags.append, LoopTools(clock), interval=0.001)
    monitor.start()
    await clock.advance(0.001)
    assert len(lags) == 1
    await monitor.stop()
    assert clock.pending == 0  # no tick left scheduled
    await clock.advance(0.05)  # fifty intervals
    assert len(lags) == 1


def test_on_uvloop_a_tick_held_past_its_next_due_time_keeps_ticking() -> None:
    # Real time on purpose: uvloop's own timers are the subject (it schedules a time already
    # past as a plain Handle, with no ``when()``: a tick held longer than an interval used to
    # raise there and stop the monitor for good); a fake clock would bypass them.
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
        monitor = LoopMonitor(observe, LoopTools(), interval=0.005)
        monitor.start()
        async with asyncio.timeout(5):
            await ten.wait()
        await monitor.stop()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())
    assert not errors, errors
    assert len(lags) >= 10


async def test_a_busy_loop_stretches_the_window_and_an_idle_one_restores_it() -> None:
    clock = FakeClock()
    tools = LoopTools(clock)
    samples: list[tuple[float, float]] = []
    monitor = LoopMonitor(lambda _: None, tools, interval=0.01, report=lambda *s: samples.append(s))
    monitor.start()
    try:
        for _ in range(4 * pace.SAMPLE_TICKS):  # four samples of a loop never at rest
            await clock.advance(0.01, busy=1.0)
        # The smoothed load goes 0.5, 0.75, 0.875, 0.94: the stretch follows within a few.
        assert [load for load, _ in samples] == pytest.approx([1.0] * 4)
        assert [s for _, s in samples] == pytest.approx([1.0, 3.5, 4.75, pace.MAX_STRETCH])
        assert tools.pace.stretch == samples[-1][1]  # what the outboxes and readers read
        for _ in range(pace.SAMPLE_TICKS):  # one sample of an idle loop
            await clock.advance(0.01, busy=0.0)
        assert samples[-1] == (0.0, 1.0)  # smoothed 0.47: below half load, as configured
    finally:
        await monitor.stop()
    assert tools.pace.stretch == 1.0


async def test_bulk_work_waiting_for_a_later_pass_counts_as_load() -> None:
    """Where CPU time understates the load (the core is shared), the backlog shows it."""
    clock = FakeClock()
    tools = LoopTools(clock)
    samples: list[float] = []
    monitor = LoopMonitor(lambda _: None, tools, report=lambda load, _: samples.append(load))

    async def bulk() -> None:
        await tools.share.turn()
        clock.hold(0.002, busy=0.0)  # holds the loop off its CPU, as when another process runs

    monitor.start()
    try:
        backlog = [asyncio.create_task(bulk()) for _ in range(1000)]  # 2 s of work
        await asyncio.sleep(0)  # one loop pass: every task has asked, most wait
        assert tools.share.backlogged
        for _ in range(pace.SAMPLE_TICKS):
            await clock.advance(0.01)  # a tick, then the loop passes the backlog goes on in
        await asyncio.gather(*backlog)
    finally:
        await monitor.stop()
    assert not tools.share.backlogged  # all taken
    assert samples == [1.0]  # every tick saw work waiting; the CPU time alone says 0


@pytest.mark.skipif(not Path("/proc/thread-self/schedstat").exists(), reason="Linux schedstat")
async def test_a_loop_waiting_for_its_core_counts_as_busy() -> None:
    """Beside a busy process on its core the loop runs half the time and never rests: load ~1.

    Real time and a real second process on purpose (the kernel's accounting is the subject).
    Its CPU time over the wall time says the core's share (about half) instead: the window
    stretched only half way on a shared core (a real-clock busy-loop test failed for it on a
    loaded machine).
    """
    samples: list[float] = []
    eight = asyncio.Event()

    def report(load: float, _stretch: float) -> None:
        samples.append(load)
        if len(samples) == 8:
            eight.set()

    monitor = LoopMonitor(lambda _: None, LoopTools(), interval=0.01, report=report)
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
