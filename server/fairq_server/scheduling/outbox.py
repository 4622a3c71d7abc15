"""What one request tells its caller, in order, with bounded buffering.

The dispatcher puts lifecycle events (queued, started, finished, or the error) and the stream
reader at the backend edge puts generated text; the API layer takes them. The backend is read
as fast as it answers, whatever the caller does, so a backend slot is free as soon as the
backend is done. Text the caller has not taken yet is buffered up to ``limit`` characters: a
caller that stops reading is cut off (:meth:`put_text` returns False) instead of holding
memory or the backend.

Text is merged: a take returns everything buffered as one piece, and a fast stream is handed
out at most once per ``window`` (the first piece goes out at once; later text waits at most
one window, far below what a reader notices), because each message towards the caller costs
about the same whatever its length. The window stretches while the event loop is near its
capacity (:mod:`~fairq_server.runtime.pace`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fairq_server.backends.request import StreamEnd
from fairq_server.errors import SchedulerError
from fairq_server.runtime.clock import SYSTEM_CLOCK, Clock, Timer
from fairq_server.runtime.pace import Pace

__all__ = ["Finished", "Outbox", "OutboxEvent", "Queued", "Started", "Text"]


@dataclass(frozen=True)
class Queued:
    """The request is queued; ``position`` requests are estimated to go first."""

    position: int


@dataclass(frozen=True)
class Started:
    """The request was sent to ``backend_id`` after ``queue_seconds`` in fairq's queue."""

    backend_id: str
    queue_seconds: float
    tier: str


@dataclass(frozen=True)
class Text:
    """Generated text, and what the backend sent beside it (tool calls, logprobs), if any."""

    text: str
    extra: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Relayed:
    """The backend's own stream chunks, as received and already framed as server-sent events.

    What a request that relays the backend's chunks (``BackendRequest.relay_chunks``: the
    HTTP door's) gets in place of :class:`Text`.
    """

    frames: str


@dataclass(frozen=True)
class Finished:
    """The generation ended normally; token counts are the backend's where it gave them."""

    end: StreamEnd
    prompt_tokens: int
    completion_tokens: int
    queue_seconds: float
    ttft_seconds: float
    total_seconds: float


OutboxEvent = Queued | Started | Text | Relayed | Finished


class Outbox:
    """A request's events on their way to the caller.

    Args:
        limit: most characters of text held for a caller that does not read.
        window: text is handed out at most once per this many seconds (0: as it comes),
            stretched by ``pace``.
        pace: the loop's :class:`~fairq_server.runtime.pace.Pace` (None: the window as given).
        clock: what the window is measured and waited on.
        relay: the text put is the backend's framed chunks: handed out as :class:`Relayed`.

    """

    def __init__(
        self,
        limit: int = 1 << 20,
        window: float = 0.0,
        pace: Pace | None = None,
        clock: Clock = SYSTEM_CLOCK,
        *,
        relay: bool = False,
    ) -> None:
        self.limit = limit
        self._relay = relay
        self._window = window
        self._items: deque[OutboxEvent | SchedulerError] = deque()
        self._text: list[str] = []  # text after the last item, not yet an item
        self._extra: list[Mapping[str, Any]] = []  # beside that text
        self._buffered = 0
        self._ready = asyncio.Event()
        self._last_taken = -window
        self._timer: Timer | None = None  # wakes the taker at a window's end
        self._pace = pace if pace is not None else Pace()
        self._clock = clock
        self._monotonic = clock.monotonic  # bound once: read per piece of text

    def put(self, event: Queued | Started | Finished) -> None:
        """Append a lifecycle event."""
        self._flush_text()
        self._items.append(event)
        self._ready.set()

    def put_text(self, text: str, extra: tuple[Mapping[str, Any], ...] = ()) -> bool:
        """Append text; False if the caller has left more than ``limit`` characters unread."""
        self._text.append(text)
        if extra:
            self._extra.extend(extra)
        self._buffered += len(text)
        if self._timer is None and not self._ready.is_set():
            # Wake the taker when its window ends, not now: waking it only for it to sleep
            # out the rest of the window would cost a task step per message (the first
            # text, and text after a quiet window, still goes at once).
            wait = self._last_taken + self._window * self._pace.stretch - self._monotonic()
            if wait > 0 and not self._items:
                self._timer = self._clock.call_later(wait, self._window_ended)
            else:
                self._ready.set()
        return self._buffered <= self.limit

    def _window_ended(self) -> None:
        self._timer = None
        self._ready.set()

    def fail(self, error: SchedulerError) -> None:
        """End with ``error``, after what was put before it."""
        self._flush_text()
        self._items.append(error)
        self._ready.set()

    def _flush_text(self) -> None:
        if self._text:
            joined = "".join(self._text)
            self._items.append(Relayed(joined) if self._relay else Text(joined, tuple(self._extra)))
            self._text, self._extra = [], []

    async def take(self) -> list[OutboxEvent]:
        """Wait for events and return all there are, text merged.

        Raises:
            SchedulerError: the request failed (after the events before it were taken).

        """
        while not self._items and not self._text:
            self._ready.clear()
            await self._ready.wait()
        if not self._items:
            wait = self._last_taken + self._window * self._pace.stretch - self._monotonic()
            if wait > 0:
                await self._clock.sleep(wait)  # pacing: let the rest of this window arrive
        if self._timer is not None:  # everything is taken now: no wake-up due
            self._timer.cancel()
            self._timer = None
        self._flush_text()
        taken: list[OutboxEvent] = []
        while self._items:
            item = self._items.popleft()
            if isinstance(item, SchedulerError):
                if taken:
                    self._items.appendleft(item)  # raised at the next take
                    break
                raise item
            if isinstance(item, Text):
                self._buffered -= len(item.text)
                if taken and isinstance(taken[-1], Text):
                    taken[-1] = Text(taken[-1].text + item.text, taken[-1].extra + item.extra)
                    continue
            elif isinstance(item, Relayed):
                self._buffered -= len(item.frames)
                if taken and isinstance(taken[-1], Relayed):
                    taken[-1] = Relayed(taken[-1].frames + item.frames)
                    continue
            taken.append(item)
        if any(isinstance(e, Text | Relayed) for e in taken):
            self._last_taken = self._monotonic()
        if not self._items:
            self._ready.clear()  # the next text then sets the window's wake-up (put_text)
        return taken
