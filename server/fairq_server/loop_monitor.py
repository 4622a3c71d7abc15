"""Event-loop lag and load: how late a short timer fires on fairq's loop, how busy the loop is.

Everything in fairq shares one asyncio loop, so a long callback, or a long run of them in one
loop pass, delays every other request, health check and scrape. A timer that should fire
every ``interval`` seconds fires late by exactly that delay, so its lateness, observed into a
histogram (``fairq_event_loop_lag_seconds``), measures how long the loop went without getting
back to its timers. A stall of S seconds shows as a tick late by between S - ``interval`` and
S; at 10 ms the bound is tight. The tick is a plain timer callback, not a task sleeping in a
loop: a hundred wake-ups a second are then a callback each (no task step, no future), a
fifth of an idle fairq's CPU before (docs/design/hot-path.md).

Every :data:`~fairq_server.pace.SAMPLE_TICKS` ticks the monitor also samples the loop's load
for the coalescing window's stretch (:mod:`~fairq_server.pace`). The loop's thread is busy
while it runs and while it is ready to run but waits for a core another process holds: on a
shared core the CPU time alone reads as the core's share (half of it beside one busy process)
while the loop never rests. Linux says both in ``/proc/thread-self/schedstat`` (the time run
and the time waited on a run queue, in nanoseconds), read with one ``pread`` per sample;
elsewhere, the thread's CPU time alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable

from fairq_server import loop_share, pace

__all__ = ["LoopMonitor"]


class LoopMonitor:
    """Reports the lateness of an ``interval``-second timer to ``observe`` (e.g. a histogram's).

    Args:
        observe: called with each tick's lateness in seconds.
        interval: the timer's period.
        report: called with each load sample and the stretch it set (e.g. to set gauges).

    """

    def __init__(
        self,
        observe: Callable[[float], None],
        interval: float = 0.01,
        report: Callable[[float, float], None] | None = None,
    ) -> None:
        self._observe = observe
        self._interval = interval
        self._report = report
        # uvloop's call_at returns a plain Handle, with no ``when()``, for a time already past
        # (the observer or the OS held the tick longer than an interval): the due time is
        # kept here instead.
        self._timer: asyncio.Handle | None = None
        self._due = 0.0
        self._pace: pace.Pace | None = None
        self._ticks = 0  # since the last load sample
        self._behind = 0  # of those, ticks at which bulk work waited for a later pass
        self._since = (0.0, 0.0)  # (wall, loop thread busy) at the last load sample
        self._schedstat: int | None = None  # the loop thread's schedstat, open

    def start(self) -> None:
        """Start measuring on the running loop."""
        loop = asyncio.get_running_loop()
        self._pace = pace.for_loop(loop)
        self._ticks = self._behind = 0
        self._close()
        with contextlib.suppress(OSError):  # not Linux: the CPU time alone
            self._schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        self._since = (time.monotonic(), self._busy())
        self._due = loop.time() + self._interval
        self._timer = loop.call_at(self._due, self._tick, loop)

    async def stop(self) -> None:
        """Stop measuring."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pace is not None:
            self._pace.reset()
        self._close()

    def _close(self) -> None:
        if self._schedstat is not None:
            os.close(self._schedstat)
            self._schedstat = None

    def _busy(self) -> float:
        """Seconds the loop's thread has run or waited for a core (its CPU time, if unknown).

        Called on the loop's thread (the schedstat file is the thread's that opened it).
        """
        if self._schedstat is not None:
            try:
                ran, waited = os.pread(self._schedstat, 128, 0).split()[:2]
                return (int(ran) + int(waited)) / 1e9
            except (OSError, ValueError):  # unreadable after all: the CPU time from now on
                self._close()
        return time.thread_time()

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        self._observe(max(0.0, now - self._due))
        self._ticks += 1
        if loop_share.backlogged(loop):
            self._behind += 1
        if self._ticks >= pace.SAMPLE_TICKS:
            self._sample()
        self._due = now + self._interval
        self._timer = loop.call_at(self._due, self._tick, loop)

    def _sample(self) -> None:
        wall, busy = time.monotonic(), self._busy()  # the tick runs on the loop's thread
        spent = (busy - self._since[1]) / max(wall - self._since[0], 1e-6)
        load = max(spent, self._behind / self._ticks)
        self._since, self._ticks, self._behind = (wall, busy), 0, 0
        assert self._pace is not None
        self._pace.observe(load)
        if self._report is not None:
            self._report(load, self._pace.stretch)
