"""Bulk work taking turns: a burst is spread over loop passes, first come first served."""

from __future__ import annotations

import asyncio

import pytest

from fairq_server.runtime.loop_share import LoopShare
from fairq_server.runtime.loop_tools import LoopTools
from tests.fakeclock import FakeClock

WORK = 0.001  # seconds each piece of bulk work holds the loop (on the fake clock)
SLICE = 0.005
# The slices are measured on a fake clock the work moves by hand: each piece holds the loop
# exactly WORK, whatever the machine's load, and no test spins the CPU.
CLOCK = FakeClock()


class PassCounter:
    """Counts loop passes: a callback that queues itself again runs once per pass."""

    def __init__(self) -> None:
        self.passes = 0
        self._handle: asyncio.Handle | None = None

    def start(self) -> None:
        self.passes += 1
        self._handle = asyncio.get_running_loop().call_soon(self.start)

    def stop(self) -> None:
        assert self._handle is not None
        self._handle.cancel()


def hold_loop(seconds: float) -> None:
    CLOCK.hold(seconds)


async def test_a_turn_on_an_idle_loop_does_not_suspend() -> None:
    turn = LoopShare(SLICE, CLOCK).turn()
    with pytest.raises(StopIteration):
        turn.send(None)


async def test_the_loops_share_measures_its_slice_on_the_loops_clock() -> None:
    clock = FakeClock()
    share = LoopTools(clock).share

    async def two_turns() -> None:
        await share.turn()  # opens an epoch
        clock.hold(2 * SLICE)  # the epoch's slice used up, on this clock only
        await share.turn()

    task = asyncio.create_task(two_turns())
    await asyncio.sleep(0)  # one loop pass: the first turn taken, the second put in line
    assert share.backlogged and not task.done()
    await task  # granted in the next epoch
    assert not share.backlogged


async def test_a_burst_is_spread_over_passes_in_arrival_order_and_timers_run_between() -> None:
    share = LoopShare(SLICE, CLOCK)
    counter = PassCounter()
    granted: list[tuple[int, int]] = []  # (task number, pass number)

    async def bulk(number: int) -> None:
        await share.turn()
        granted.append((number, counter.passes))
        hold_loop(WORK)

    loop = asyncio.get_running_loop()
    other_ran: asyncio.Future[int] = loop.create_future()
    counter.start()
    tasks = [asyncio.create_task(bulk(n)) for n in range(200)]  # 200 ms of work at once
    # Other work queued once the burst has started: it runs between epochs, not after all.
    loop.call_soon(lambda: other_ran.set_result(sum(not t.done() for t in tasks)))
    async with asyncio.timeout(10):
        unfinished = await other_ran
        await asyncio.gather(*tasks)
    counter.stop()

    assert [n for n, _ in granted] == list(range(200))
    per_pass: dict[int, int] = {}
    for _, number in granted:
        per_pass[number] = per_pass.get(number, 0) + 1
    # One epoch: turns until a slice has passed (a few over: a turn is granted before its
    # work runs), and an epoch never spans more than two passes.
    assert max(per_pass.values()) <= 2 * (SLICE / WORK + 2), per_pass
    assert len(per_pass) >= 200 * WORK / SLICE / 2
    # The other work did not wait for the burst: it ran with most of the burst still to run.
    assert unfinished > 190, unfinished


async def test_a_cancelled_waiter_leaves_the_line_moving() -> None:
    share = LoopShare(SLICE, CLOCK)
    done: list[int] = []

    async def bulk(number: int) -> None:
        await share.turn()
        hold_loop(WORK)
        done.append(number)

    tasks = [asyncio.create_task(bulk(n)) for n in range(40)]
    await asyncio.sleep(0)  # every task has asked; most wait
    assert share.waiting > 20
    for task in tasks[10:30]:
        task.cancel()
    async with asyncio.timeout(10):
        results = await asyncio.gather(*tasks, return_exceptions=True)
    cancelled = [i for i, r in enumerate(results) if isinstance(r, asyncio.CancelledError)]
    assert sorted(done + cancelled) == list(range(40))
    assert done == sorted(done)
    assert len(cancelled) >= 15  # those already through when cancelled finished normally


async def test_a_line_of_cheap_turns_drains_in_few_passes() -> None:
    """After an epoch that had time to spare, the next one wakes twice as many waiters: a
    line behind one slow turn is not served one waiter per pass."""
    share = LoopShare(SLICE, CLOCK)
    counter = PassCounter()

    async def slow() -> None:
        await share.turn()
        hold_loop(SLICE * 1.2)  # uses the whole epoch: the batch drops to 1

    async def cheap() -> None:
        await share.turn()

    counter.start()
    tasks = [asyncio.create_task(slow()), asyncio.create_task(slow())]
    tasks += [asyncio.create_task(cheap()) for _ in range(500)]
    start = counter.passes
    async with asyncio.timeout(10):
        await asyncio.gather(*tasks)
    counter.stop()
    assert counter.passes - start < 60, counter.passes - start


async def test_an_urgent_turn_goes_ahead_of_the_line_but_within_the_slice() -> None:
    """A stream's first piece of work does not wait for the reads queued before it."""
    share = LoopShare(SLICE, CLOCK)
    counter = PassCounter()
    order: list[str] = []
    passes: dict[str, int] = {}

    async def bulk(name: str, urgent: bool = False) -> None:
        await share.turn(urgent)
        order.append(name)
        passes[name] = counter.passes
        hold_loop(WORK)

    counter.start()
    tasks = [asyncio.create_task(bulk(f"read{n}")) for n in range(100)]  # 100 ms of work
    await asyncio.sleep(0)  # every read has asked; most wait for later epochs
    assert share.waiting > 50
    urgent = [asyncio.create_task(bulk(f"first{n}", urgent=True)) for n in range(3)]
    async with asyncio.timeout(10):
        await asyncio.gather(*urgent)
        reads_before = sum(name.startswith("read") for name in order)
        await asyncio.gather(*tasks)
    counter.stop()
    # Served within an epoch or two of asking, not after the hundred reads (~20 epochs),
    # in the order they asked; the reads keep theirs.
    assert reads_before < 30, order
    assert [n for n in order if n.startswith("first")] == ["first0", "first1", "first2"]
    assert [n for n in order if n.startswith("read")] == [f"read{n}" for n in range(100)]
    # Still within the slice: no pass ran the urgent turns on top of a full epoch.
    per_pass: dict[int, int] = {}
    for number in passes.values():
        per_pass[number] = per_pass.get(number, 0) + 1
    assert max(per_pass.values()) <= 2 * (SLICE / WORK + 2), per_pass
