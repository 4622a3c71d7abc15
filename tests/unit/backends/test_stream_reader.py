"""The stream reader's pacing: a fast stream is read once per window, except near its end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from fairq_server.backends.request import StreamEnd, StreamEvent, TextDelta
from fairq_server.backends.stream_reader import start_reading
from fairq_server.backends.vllm import VllmBackend
from fairq_server.runtime.loop_tools import LoopTools
from fairq_server.scheduling.attempt_stream import AttemptSink
from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.prefix import PrefixCache
from tests.fakeclock import FakeClock
from tests.unit.scheduling.helpers import ticket

WINDOW = 0.3
EVERY = 0.03  # the backend's time per token
TOKENS = 15


class Sink:
    """Records when the reader reported the stream's end; ``bound`` is the output bound."""

    def __init__(self, bound: int | None, clock: FakeClock) -> None:
        self.bound = bound
        self.clock = clock
        self.tokens = 0
        self.ended_at: float | None = None

    def text(self, delta: TextDelta) -> bool:
        self.tokens += delta.tokens
        return True

    def ended(self, end: StreamEnd) -> None:
        self.ended_at = self.clock.monotonic()

    def failed(self, error: Exception) -> None:
        raise AssertionError(error)

    def left(self) -> int | None:
        return None if self.bound is None else self.bound - self.tokens


async def _backend(events: asyncio.Queue[StreamEvent], clock: FakeClock) -> float:
    """Produce a token every EVERY seconds, then the end; return when the end was produced.

    The backend runs on its own timeline, whether or not anyone reads (as a socket fills).
    """
    for _ in range(TOKENS):
        await clock.sleep(EVERY)
        events.put_nowait(TextDelta("x"))
    events.put_nowait(StreamEnd(finish_reason="length"))
    return clock.monotonic()


async def _stream(events: asyncio.Queue[StreamEvent]) -> AsyncGenerator[StreamEvent]:
    while True:
        yield await events.get()


@pytest.mark.parametrize("bound", [None, TOKENS])
async def test_the_end_of_a_bounded_stream_is_seen_as_it_comes(bound: int | None) -> None:
    """Without a bound the end waits out the window it fell in (210 ms late here: the
    reader sleeps 30-330 ms and 360-660 ms, the end comes at 450); with one, the window in
    which the end is due is cut to the time the tokens left take at the stream's pace.

    Backend and reader run on a fake clock: the lateness is exact, whatever the machine's load.
    """
    clock = FakeClock()
    events: asyncio.Queue[StreamEvent] = asyncio.Queue()
    sink = Sink(bound, clock)
    produced = asyncio.create_task(_backend(events, clock))
    reading = start_reading(_stream(events), sink, WINDOW, LoopTools(clock))
    await clock.advance(2 * TOKENS * EVERY + WINDOW)  # long past the end and its window
    assert reading.done() and produced.done()
    end = produced.result()
    assert sink.tokens == TOKENS and sink.ended_at is not None
    late = sink.ended_at - end
    if bound is None:
        assert late == pytest.approx(0.21), late  # the control: the window holds the end back
    else:
        assert late == pytest.approx(0.0), late


@pytest.mark.parametrize(("max_in_flight", "expected"), [(0, None), (8, 10)])
def test_an_attempt_knows_its_end_only_where_fairq_counts_the_slots(
    max_in_flight: int, expected: int | None
) -> None:
    """A late end costs a slot only where fairq fills every one (``max_in_flight``); elsewhere
    the engine's own queue fills it, and the stream stays paced by whole windows."""
    t = ticket("u", max_tokens=16)
    backend = VllmBackend("b", "http://127.0.0.1:9", ["m"], max_in_flight=max_in_flight)
    t.backend = BackendState(backend, PrefixCache(16))
    sink = AttemptSink(lambda event: None, t)
    sink.text(TextDelta("abcdef", tokens=6))
    assert sink.left() == expected
