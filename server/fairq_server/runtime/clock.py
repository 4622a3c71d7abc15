"""Time as an object: what fairq's loop helpers read and wait on, so a test can move it by hand.

Every part of :mod:`fairq_server.runtime` (and the outbox and stream reader that pace on it)
takes a :class:`Clock` instead of calling :mod:`time` and :mod:`asyncio` itself. The process
passes :data:`SYSTEM_CLOCK`, whose methods *are* the standard library's functions (no wrapper
frame on the hot path: ``clock.monotonic`` is ``time.monotonic``); a test passes a fake
(``tests/fakeclock.py``) and advances it, instead of sleeping and hoping the machine kept up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock", "Timer"]

# Whether /proc/thread-self/schedstat is worth trying (False after it failed once).
_SCHEDSTAT = [True]


class Timer(Protocol):
    """A callback scheduled by :meth:`Clock.call_later` (an ``asyncio.TimerHandle``)."""

    def cancel(self) -> None:
        """Do not run the callback (harmless once it ran)."""
        ...


class Clock(Protocol):
    """Monotonic time, CPU time, and waiting for time to pass, on the running loop."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (the loop's timers' clock)."""
        ...

    def thread_time(self) -> float:
        """CPU seconds the calling thread has spent (the loop's, when called on it)."""
        ...

    def busy_time(self) -> float:
        """Seconds the calling thread has run or waited for a core (at least its CPU time)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds`` have passed on this clock."""
        ...

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        """Run ``callback`` on the running loop once ``delay`` seconds have passed."""
        ...


class SystemClock:
    """The real clock: :func:`time.monotonic`, :func:`time.thread_time`, the loop's timers."""

    # The functions themselves, not methods calling them: reading the clock costs what
    # calling ``time.monotonic()`` did (one attribute lookup where it is bound once).
    monotonic = staticmethod(time.monotonic)
    thread_time = staticmethod(time.thread_time)
    sleep = staticmethod(asyncio.sleep)

    @staticmethod
    def busy_time() -> float:
        """Seconds the calling thread has run or waited on a run queue (Linux's schedstat).

        The wait is time the thread was ready and another process held the core: on a
        shared core the CPU time alone is the core's share, not how busy the thread is.
        Elsewhere (or if the file cannot be read) the thread's CPU time. An open, a read and
        a close: the loop monitor calls it ten times a second.
        """
        if _SCHEDSTAT[0]:
            try:
                with open("/proc/thread-self/schedstat", "rb") as stat:
                    ran, waited = stat.read(128).split()[:2]
                return (int(ran) + int(waited)) / 1e9
            except (OSError, ValueError):
                _SCHEDSTAT[0] = False  # not Linux, or no schedstat: the CPU time from now on
        return time.thread_time()

    @staticmethod
    def call_later(delay: float, callback: Callable[[], object]) -> Timer:
        """Run ``callback`` on the running loop after ``delay`` seconds (its own timer)."""
        return asyncio.get_running_loop().call_later(delay, callback)


#: The one real clock; stateless, so the whole process may share it.
SYSTEM_CLOCK: Clock = SystemClock()
