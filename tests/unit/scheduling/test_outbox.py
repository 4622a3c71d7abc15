"""The outbox's pacing: the first text at once, later text merged per window, events at once."""

from __future__ import annotations

import asyncio

from fairq_server.backends.request import StreamEnd
from fairq_server.runtime.pace import Pace
from fairq_server.scheduling.outbox import Finished, Outbox, Started, Text
from tests.fakeclock import FakeClock

WINDOW = 0.05
# The windows run on a fake clock: a take that waits shows as an unfinished task until the
# test moves time, so the figures are exact whatever the machine's load.


async def test_first_text_goes_at_once_and_later_text_waits_for_the_window() -> None:
    clock = FakeClock()
    box = Outbox(window=WINDOW, clock=clock)
    box.put_text("a")
    assert await box.take() == [Text("a")]  # no time passed
    box.put_text("b")
    box.put_text("c")
    taker = asyncio.create_task(box.take())
    await clock.advance(WINDOW / 2)
    assert not taker.done()
    box.put_text("d")  # arrives while the taker waits for the window's end
    await clock.advance(WINDOW / 2)
    assert taker.done() and taker.result() == [Text("bcd")]


async def test_a_stretched_window_holds_later_text_longer_but_never_the_first() -> None:
    clock = FakeClock()
    loop_pace = Pace()
    loop_pace.stretch = 4.0  # as the loop monitor sets it near the loop's capacity
    box = Outbox(window=WINDOW, pace=loop_pace, clock=clock)
    box.put_text("a")
    assert await box.take() == [Text("a")]
    box.put_text("b")
    taker = asyncio.create_task(box.take())
    await clock.advance(4 * WINDOW * 0.99)
    assert not taker.done()
    await clock.advance(4 * WINDOW * 0.02)
    assert taker.done() and taker.result() == [Text("b")]


async def test_a_waiting_taker_is_woken_once_at_the_windows_end() -> None:
    """Text inside a window does not wake the taker early (it would only go back to sleep)."""
    clock = FakeClock()
    box = Outbox(window=1.0, clock=clock)
    box.put_text("a")
    await box.take()
    woken = 0
    ready = box._ready  # the taker's wake-up

    original = ready.set

    def counting_set() -> None:
        nonlocal woken
        woken += 1
        original()

    ready.set = counting_set  # type: ignore[method-assign]
    taker = asyncio.create_task(box.take())
    await asyncio.sleep(0)
    for piece in "bcdef":
        box.put_text(piece)
        await clock.advance(0.1)  # the taker runs in between, were it woken
    assert not taker.done()
    await clock.advance(0.5)  # the window's end
    assert taker.done() and taker.result() == [Text("bcdef")]
    assert woken == 1


async def test_a_lifecycle_event_wakes_the_taker_at_once_with_the_text_before_it() -> None:
    clock = FakeClock()
    box = Outbox(window=10.0, clock=clock)
    box.put_text("a")
    await box.take()
    box.put_text("b")  # would wait up to 10 s
    end = Finished(StreamEnd("stop"), 1, 2, 0.0, 0.0, 0.0)
    box.put(end)
    assert await box.take() == [Text("b"), end]  # the clock never moved


async def test_no_window_hands_text_out_as_it_comes() -> None:
    box = Outbox()
    box.put(Started("b", 0.0, "standard"))
    box.put_text("a")
    assert await box.take() == [Started("b", 0.0, "standard"), Text("a")]
    box.put_text("b")
    assert await box.take() == [Text("b")]
