"""Event-loop lag and load: how late a short timer fires on fairq's loop, how busy the loop is.

Everything in fairq shares one asyncio loop, so a long callback, or a long run of them in one
loop pass, delays every other request, health check and scrape. A timer that should fire
every ``interval`` seconds fires late by exactly that delay, so its lateness, observed into a
histogram (``fairq_event_loop_lag_seconds``), measures how long the loop went without getting
back to its timers. A stall of S seconds shows as a tick late by between S - ``interval`` and
S; at 10 ms the bound is tight. The tick is a plain timer callback, not a task sleeping in a
loop: a hundred wake-ups a second are then a callback each (no task step, no future), a
fifth of an idle fairq's CPU before (docs/design/hot-path.md). The timer, the time and the CPU
time are the :class:`~fairq_server.runtime.clock.Clock`'s, so a test drives the monitor by
moving a fake clock.

Every :data:`~fairq_server.runtime.pace.SAMPLE_TICKS` ticks the monitor also samples the
loop's load for the coalescing window's stretch (:mod:`~fairq_server.runtime.pace`). The
loop's thread is busy while it runs and while it is ready to run but waits for a core another
process holds (:meth:`~fairq_server.runtime.clock.Clock.busy_time`): on a shared core its CPU
time alone reads as the core's share (half of it beside one busy process) while the loop
never rests.
"""

from __future__ import annotations

from collections.abc import Callable

from fairq_server.runtime import pace
from fairq_server.runtime.clock import Timer
from fairq_server.runtime.loop_tools import LoopTools

__all__ = ["LoopMonitor"]


class LoopMonitor:
    """Reports the lateness of an ``interval``-second timer to ``observe`` (e.g. a histogram's).

    Args:
        observe: called with each tick's lateness in seconds.
        tools: the loop's clock (ticks, time, CPU time), its share (the backlog) and the
            pace the samples set.
        interval: the timer's period.
        report: called with each load sample and the stretch it set (e.g. to set gauges).

    """

    def __init__(
        self,
        observe: Callable[[float], None],
        tools: LoopTools,
        interval: float = 0.01,
        report: Callable[[float, float], None] | None = None,
    ) -> None:
        self._observe = observe
        self._clock = tools.clock
        self._share = tools.share
        self._pace = tools.pace
        self._interval = interval
        self._report = report
        # The due time is kept here, not read from the timer: uvloop hands back a plain
        # Handle, with no ``when()``, for a time already past.
        self._timer: Timer | None = None
        self._due = 0.0
        self._ticks = 0  # since the last load sample
        self._behind = 0  # of those, ticks at which bulk work waited for a later pass
        self._since = (0.0, 0.0)  # (wall, loop thread busy) at the last load sample

    def start(self) -> None:
        """Start measuring on the running loop."""
        self._ticks = self._behind = 0
        now = self._clock.monotonic()
        self._since = (now, self._clock.busy_time())
        self._due = now + self._interval
        self._timer = self._clock.call_later(self._interval, self._tick)

    async def stop(self) -> None:
        """Stop measuring."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pace.reset()

    def _tick(self) -> None:
        now = self._clock.monotonic()
        self._observe(max(0.0, now - self._due))
        self._ticks += 1
        if self._share.backlogged:
            self._behind += 1
        if self._ticks >= pace.SAMPLE_TICKS:
            self._sample()
        self._due = now + self._interval
        self._timer = self._clock.call_later(self._interval, self._tick)

    def _sample(self) -> None:
        # The tick runs on the loop's thread: its busy time is the loop's.
        wall, busy = self._clock.monotonic(), self._clock.busy_time()
        spent = (busy - self._since[1]) / max(wall - self._since[0], 1e-6)
        load = max(spent, self._behind / self._ticks)
        self._since, self._ticks, self._behind = (wall, busy), 0, 0
        self._pace.observe(load)
        if self._report is not None:
            self._report(load, self._pace.stretch)
