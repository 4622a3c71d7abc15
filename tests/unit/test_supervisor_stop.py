"""Supervised loops: restarted after a crash on schedule, stopped for sure though library code
swallows a cancellation."""

from __future__ import annotations

import asyncio

import pytest

from fairq_server.runtime.supervisor import cancel_all, stop_asked, stop_task, supervise
from tests.fakeclock import FakeClock


async def _swallowing_step(done: asyncio.Event) -> None:
    """A step of library code that loses a cancellation, as Python 3.11's ``wait_for`` does
    when the work it waits on completes at the same moment."""
    try:
        await done.wait()
    except asyncio.CancelledError:
        return


async def test_a_loop_that_tests_stop_asked_ends_after_a_swallowed_cancellation() -> None:
    turns = 0
    step = asyncio.Event()

    async def loop() -> None:
        nonlocal turns
        while not stop_asked():
            turns += 1
            await _swallowing_step(step)

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)  # in its first step
    task.cancel()
    await asyncio.wait({task}, timeout=5)
    # The step swallowed the one cancellation; the loop's head saw it was asked to stop.
    assert task.done() and not task.cancelled()
    assert turns == 1


async def test_cancel_all_cancels_again_until_the_task_has_ended() -> None:
    swallowed = 0

    async def swallows_twice() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed == 3:
                    raise

    task = asyncio.create_task(swallows_twice())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_all([task]), timeout=5)
    assert task.cancelled() and swallowed == 3


async def test_stop_task_does_not_swallow_its_caller_s_cancellation() -> None:
    inner = asyncio.create_task(asyncio.Event().wait())
    started = asyncio.Event()

    async def stopper() -> None:
        started.set()
        await stop_task(inner)
        await asyncio.Event().wait()  # only a cancellation of its own ends this

    outer = asyncio.create_task(stopper())
    await started.wait()
    outer.cancel()
    await asyncio.wait({outer}, timeout=5)
    assert outer.cancelled()
    assert inner.cancelled()


async def test_stop_asked_is_false_after_a_timeout_took_its_cancellation_back() -> None:
    try:
        async with asyncio.timeout(0.01):
            await asyncio.Event().wait()
    except TimeoutError:
        pass
    assert not stop_asked()


async def test_a_crashed_loop_is_restarted_after_each_delay_in_turn() -> None:
    clock = FakeClock()
    runs: list[float] = []
    crashes: list[BaseException] = []

    async def run() -> None:
        runs.append(clock.monotonic())
        if len(runs) < 4:
            raise RuntimeError("injected")

    supervised = asyncio.create_task(
        supervise("test loop", run, on_crash=crashes.append, delays=(0.05, 0.2), clock=clock)
    )
    await clock.advance()  # the first run, and its crash
    assert runs == [1000.0] and len(crashes) == 1
    await clock.advance(0.049)
    assert len(runs) == 1  # the first delay not yet over
    await clock.advance(0.001 + 0.2 + 0.2 + 0.01)  # then 0.2, and the last delay repeats
    assert runs == pytest.approx([1000.0, 1000.05, 1000.25, 1000.45])
    assert supervised.done() and len(crashes) == 3
