"""Event-loop lag: how late a short timer fires on fairq's loop.

Everything in fairq shares one asyncio loop, so a long callback, or a long run of them in one
loop pass, delays every other request, health check and scrape. A timer that should fire
every ``interval`` seconds fires late by exactly that delay, so its lateness, observed into a
histogram (``fairq_event_loop_lag_seconds``), measures how long the loop went without getting
back to its timers. A stall of S seconds shows as a tick late by between S - ``interval`` and
S; at 10 ms the bound is tight. The tick is a plain timer callback, not a task sleeping in a
loop: a hundred wake-ups a second are then a callback each (no task step, no future), a
fifth of an idle fairq's CPU before (docs/design/hot-path.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["LoopMonitor"]


class LoopMonitor:
    """Reports the lateness of an ``interval``-second timer to ``observe`` (e.g. a histogram's)."""

    def __init__(self, observe: Callable[[float], None], interval: float = 0.01) -> None:
        self._observe = observe
        self._interval = interval
        # uvloop's call_at returns a plain Handle, with no ``when()``, for a time already past
        # (the observer or the OS held the tick longer than an interval): the due time is
        # kept here instead.
        self._timer: asyncio.Handle | None = None
        self._due = 0.0

    def start(self) -> None:
        """Start measuring on the running loop."""
        loop = asyncio.get_running_loop()
        self._due = loop.time() + self._interval
        self._timer = loop.call_at(self._due, self._tick, loop)

    async def stop(self) -> None:
        """Stop measuring."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        self._observe(max(0.0, now - self._due))
        self._due = now + self._interval
        self._timer = loop.call_at(self._due, self._tick, loop)
