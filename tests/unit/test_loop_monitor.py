"""The event-loop lag monitor reports a callback that holds the loop as that much lag."""

from __future__ import annotations

import asyncio
import time

import uvloop

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
