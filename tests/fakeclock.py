"""A clock that moves only when the test says: what replaces sleeping in tests of timed code.

:class:`FakeClock` implements :class:`~fairq_server.runtime.clock.Clock`. Code under test
reads its time and sets its timers on it; the test calls :meth:`FakeClock.advance`, which
moves time forward timer by timer (each fires at its own due time, and the tasks it wakes run
to their next wait before the next one fires), or :meth:`FakeClock.hold`, which moves time
while nothing runs (the loop held by a long callback, or the process off the CPU). A test
then asserts exact figures instead of ranges wide enough for a loaded machine.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

__all__ = ["FakeClock"]

# Loop passes given to the tasks a timer woke before the next timer fires: a woken task runs
# in the next pass, a task waiting on that one in the pass after, and so on.
SETTLE_PASSES = 5


class FakeTimer:
    """A callback due at ``when`` on a :class:`FakeClock`."""

    __slots__ = ("callback", "cancelled", "seq", "when")

    def __init__(self, when: float, seq: int, callback: Callable[[], object]) -> None:
        self.when, self.seq, self.callback, self.cancelled = when, seq, callback, False

    def __lt__(self, other: FakeTimer) -> bool:
        return (self.when, self.seq) < (other.when, other.seq)

    def cancel(self) -> None:
        """Do not run the callback."""
        self.cancelled = True


class FakeClock:
    """Monotonic and CPU time that move only by :meth:`advance` and :meth:`hold`.

    Args:
        start: the monotonic time at first (not 0: code may take a time before 0 for
            "long ago", as the real clock's is the machine's uptime). Sums of fake seconds
            are floats: leave a margin where a test lands on a due time exactly.

    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._cpu = 0.0
        self._timers: list[FakeTimer] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        """The fake time."""
        return self._now

    def thread_time(self) -> float:
        """The fake CPU time: grows only by ``busy`` in :meth:`advance` and :meth:`hold`."""
        return self._cpu

    def busy_time(self) -> float:
        """The fake CPU time (a fake thread never waits for a core)."""
        return self._cpu

    def call_later(self, delay: float, callback: Callable[[], object]) -> FakeTimer:
        """Run ``callback`` when the clock is advanced ``delay`` seconds past now."""
        timer = FakeTimer(self._now + max(delay, 0.0), next(self._seq), callback)
        heapq.heappush(self._timers, timer)
        return timer

    async def sleep(self, seconds: float) -> None:
        """Return once the clock is advanced ``seconds`` past now."""
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = self.call_later(seconds, lambda: woken.done() or woken.set_result(None))
        try:
            await woken
        finally:
            timer.cancel()

    @property
    def pending(self) -> int:
        """Timers set and neither fired nor cancelled."""
        return sum(not t.cancelled for t in self._timers)

    def hold(self, seconds: float, *, busy: float = 1.0) -> None:
        """Move time by ``seconds`` with nothing running (a callback holding the loop).

        ``busy``: the share of it spent on the loop's CPU (0: the process was off the CPU).
        Timers that fall due meanwhile fire at the next :meth:`advance`, late.
        """
        self._now += seconds
        self._cpu += busy * seconds

    async def advance(self, seconds: float = 0.0, *, busy: float = 0.0) -> None:
        """Move time by ``seconds``, firing every timer due on the way at its own time.

        After each timer, the tasks it woke run until they wait again (and may set new
        timers, fired in turn if due). ``busy``: the share of the time spent on the loop's
        CPU. ``advance()`` alone fires what is already overdue.
        """
        end = self._now + seconds
        await self._settle()
        while self._timers and self._timers[0].when <= end:
            timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            if timer.when > self._now:
                self._cpu += busy * (timer.when - self._now)
                self._now = timer.when
            timer.callback()
            await self._settle()
        self._cpu += busy * (end - self._now)
        self._now = max(self._now, end)

    @staticmethod
    async def _settle() -> None:
        for _ in range(SETTLE_PASSES):
            await asyncio.sleep(0)  # one loop pass each, no wall time: woken tasks run
