"""Event-loop lag: how late a short timer fires on fairq's loop.

Everything in fairq shares one asyncio loop, so a long callback, or a long run of them in one
loop pass, delays every other request, health check and scrape. A timer that should fire
every ``interval`` seconds fires late by exactly that delay, so its lateness, observed into a
histogram (``fairq_event_loop_lag_seconds``), measures how long the loop went without getting
back to its timers. A stall of S seconds shows as a tick late by between S - ``interval`` and
S; at 10 ms the bound is tight, and a hundred wake-ups a second cost the loop a few ms of CPU
a second.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

__all__ = ["LoopMonitor"]


class LoopMonitor:
    """Reports the lateness of an ``interval``-second timer to ``observe`` (e.g. a histogram's)."""

    def __init__(self, observe: Callable[[float], None], interval: float = 0.01) -> None:
        self._observe = observe
        self._interval = interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start measuring on the running loop."""
        self._task = asyncio.create_task(self._run(), name="loop-monitor")

    async def stop(self) -> None:
        """Stop measuring."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self._interval
            await asyncio.sleep(self._interval)
            self._observe(max(0.0, loop.time() - due))
