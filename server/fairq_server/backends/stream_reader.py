"""Reading one backend stream at the backend's pace, reporting to a sink as it goes.

The reader is the first to know when a backend starts a request (its first token) and when it
is done, so it reports those itself, whatever the caller of fairq is doing: a backend slot is
freed when the backend finishes, not when a slow client has read the last word.

Reading paces itself for fast streams: once a read had to wait for the network (fairq has
caught up with the backend), the next read waits out ``window`` first, so the socket gathers
that window's tokens and the HTTP parser hands them over at once, instead of waking fairq per
token. The window stretches while the event loop is near its capacity
(:mod:`~fairq_server.runtime.pace`). A stream whose output bound falls within what one window
gathers waits only for the time its last tokens take at that pace: its end, and the slot it
frees, is seen as it comes, not up to a window late (on an engine whose every slot fairq
fills, a late end is a slot left empty: docs/benchmarks/preemption.md).

The reading task starts when :func:`start_reading` is called, not when anything awaits it:
requests started together reach the backend in the order they were started.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Protocol

from fairq_server.backends.request import StreamEnd, StreamEvent, TextDelta
from fairq_server.errors import BackendError, BackendFailure
from fairq_server.runtime.loop_tools import LoopTools

__all__ = ["StreamSink", "start_reading"]

# A read that took longer than this waited for the network (a buffered one takes ~20 us).
_CAUGHT_UP = 0.001


class StreamSink(Protocol):
    """Where a reader reports one backend stream.

    Exactly one of :meth:`ended` and :meth:`failed` is called, unless the reading task is
    cancelled (then neither is).
    """

    def text(self, delta: TextDelta) -> bool:
        """Take generated text; return False to stop reading (and abort the request)."""
        ...

    def ended(self, end: StreamEnd) -> None:
        """Report that the backend finished the generation."""
        ...

    def failed(self, error: Exception) -> None:
        """Report a failed stream: a backend error, or anything the adapter raised."""
        ...

    def left(self) -> int | None:
        """Return the tokens the stream may still produce by its output bound.

        None: unknown, or not worth knowing (asked first before the stream is read: None then
        means the stream is always paced by whole windows).
        """
        ...


def start_reading(
    stream: AsyncGenerator[StreamEvent],
    sink: StreamSink,
    window: float = 0.0,
    tools: LoopTools | None = None,
) -> asyncio.Task[None]:
    """Start reading ``stream`` into ``sink``; cancel the task to abort the backend request.

    ``tools``: the loop's share (the reader's first turn), pace and clock (a fresh set if
    None: the window unstretched, on the real clock).
    """
    return asyncio.create_task(_read(stream, sink, window, tools or LoopTools()))


async def _read(
    stream: AsyncGenerator[StreamEvent], sink: StreamSink, window: float, tools: LoopTools
) -> None:
    async with contextlib.aclosing(stream):  # closing the stream aborts the backend request
        # Opening a backend request is bulk work: a wave of finished streams frees as many
        # slots at once. An urgent turn: the request's time to first token waits for it.
        await tools.share.turn(urgent=True)
        stretch = tools.pace
        monotonic, sleep = tools.clock.monotonic, tools.clock.sleep  # read per token
        try:
            asked = monotonic()
            gathered = 0  # tokens read since fairq last caught up with the backend
            per_window = 0  # what the last window gathered
            slept = False
            bounded = sink.left() is not None  # else every read waits out the window
            async for event in stream:
                if isinstance(event, StreamEnd):
                    sink.ended(event)
                    return
                if not sink.text(event):
                    return
                gathered += event.tokens
                now = monotonic()
                if window and now - asked > _CAUGHT_UP:
                    if slept:
                        per_window = gathered
                    gathered = 0
                    pause = window * stretch.stretch
                    left = sink.left() if bounded else None
                    slept = left is None or left > per_window
                    if left is not None and not slept:
                        # The end is due within this window: wait only until then.
                        pause *= max(left, 0) / per_window if per_window else 0.0
                    if pause:
                        await sleep(pause)
                        now = monotonic()
                asked = now
        except Exception as exc:  # reported, never raised: nothing awaits this task
            sink.failed(exc)
            return
    # Adapters raise when a stream stops without its final event; this is the backstop.
    sink.failed(
        BackendError("the backend ended the stream without finishing", BackendFailure.UNAVAILABLE)
    )
