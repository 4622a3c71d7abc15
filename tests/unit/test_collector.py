"""The collector keeps full passes for quiet moments, and still frees old cycles."""

from __future__ import annotations

import gc
import weakref
from collections.abc import AsyncIterator

import pytest

from fairq_server.runtime.collector import Collector
from tests.fakeclock import FakeClock


class Cycle:
    """An object in a reference cycle with itself: only the cycle collector frees it."""

    def __init__(self) -> None:
        self.me = self


class Live:
    """A stand-in for fairq's queued and running requests."""

    def __init__(self) -> None:
        self.requests = 0


@pytest.fixture
async def collector() -> AsyncIterator[tuple[Collector, Live, list[tuple[int, float]]]]:
    live = Live()
    passes: list[tuple[int, float]] = []
    # Checks only when the test asks (collect_if_due), never on its own.
    c = Collector(
        lambda: live.requests,
        lambda g, s: passes.append((g, s)),
        check_interval=3600,
        quiet_requests=10,
        min_interval=0.0,
    )
    c.start()
    try:
        yield c, live, passes
    finally:
        await c.stop()


def old_garbage() -> weakref.ref[Cycle]:
    """Make a cycle, let it age into the oldest generation, then drop it."""
    cycle = Cycle()
    gc.collect(1)  # survivors of the middle generation move to the oldest
    return weakref.ref(cycle)


async def test_start_freezes_the_heap_and_takes_the_oldest_generation_over() -> None:
    before = gc.get_threshold()
    c = Collector(lambda: 0, lambda g, s: None, check_interval=3600)
    c.start()
    try:
        assert gc.get_freeze_count() > 1000
        young, middle, oldest = gc.get_threshold()
        assert (young, middle) == before[:2]
        assert oldest > 1_000_000
    finally:
        await c.stop()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


async def test_old_cycles_wait_for_a_quiet_moment_and_are_freed_then(
    collector: tuple[Collector, Live, list[tuple[int, float]]],
) -> None:
    c, live, passes = collector
    live.requests = 11
    ref = old_garbage()
    for _ in range(30):  # many young passes: none reaches the oldest generation
        gc.collect(1)
    assert ref() is not None
    assert not c.collect_if_due()  # busy
    assert ref() is not None
    live.requests = 10
    assert c.collect_if_due()
    assert ref() is None
    assert (2, passes[-1][1]) == passes[-1] and passes[-1][1] >= 0
    assert {g for g, _ in passes} >= {1, 2}  # young passes are reported too
    assert not c.collect_if_due()  # nothing promoted since


async def test_quiet_moments_collect_at_most_every_min_interval() -> None:
    c = Collector(lambda: 0, lambda g, s: None, check_interval=3600, min_interval=3600)
    c.start()  # counts as a full pass: the heap was collected, then frozen
    try:
        ref = old_garbage()
        assert not c.collect_if_due()
        assert ref() is not None
    finally:
        await c.stop()


async def test_a_long_busy_spell_still_gets_a_full_pass() -> None:
    passes: list[tuple[int, float]] = []
    c = Collector(lambda: 10_000, lambda g, s: passes.append((g, s)), max_interval=0.0)
    c.start()
    try:
        ref = old_garbage()
        assert c.collect_if_due()
        assert ref() is None
    finally:
        await c.stop()


async def test_the_quiet_moment_after_min_interval_collects() -> None:
    clock = FakeClock()
    c = Collector(lambda: 0, lambda g, s: None, check_interval=1.0, min_interval=10.0, clock=clock)
    c.start()  # counts as a full pass: the heap was collected, then frozen
    try:
        ref = old_garbage()
        await clock.advance(9.0)  # nine checks, all within min_interval of the start
        assert ref() is not None
        await clock.advance(1.0)  # the tenth check: min_interval has passed
        assert ref() is None
    finally:
        await c.stop()
