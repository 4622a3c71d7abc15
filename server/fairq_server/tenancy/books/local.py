"""The one-process limit book: every counter in this process's memory, exact.

A rolling minute is 60 buckets of one second each (what was granted in that second); the
used amount is their sum, kept as a running total, so reading it costs the buckets that
expired since the last read and nothing else. Calendar windows (a UTC day or month) are one
number and the period it belongs to; a new period starts at zero.

Memory is bounded by what is live, not by history: a counter holds at most 60 buckets, and
counters with nothing left in their window are dropped by a sweep every minute, spread over
the reservations that follow (a user seen once costs nothing after its windows pass, and the
loop never stops for all counters at once).

Besides the async :class:`~fairq_server.tenancy.books.book.LimitBook` protocol, the book offers
synchronous twins (:meth:`LocalBook.reserve_now`, :meth:`LocalBook.settle_now`,
:meth:`LocalBook.used_now`): the dispatcher's loop is synchronous and must never wait for the
book in one process.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from fairq_server.tenancy.books.book import Grant, LimitKey, LimitUse, Refusal, Window

__all__ = ["LocalBook", "period_end", "period_of", "period_start"]

_MINUTE = 60
# Seconds between sweeps of counters whose windows are empty.
_SWEEP_EVERY = 60.0
# Counters a reservation checks for the sweep: a sweep is spread over many reservations, so
# the dispatcher's loop never stands still for all the counters at once.
_SWEEP_SLICE = 256


def period_of(window: Window, now: float) -> int:
    """Return the calendar period (UTC) ``now`` falls in: a day or month number."""
    day = dt.datetime.fromtimestamp(now, dt.UTC)
    if window is Window.DAY:
        return day.toordinal()
    return day.year * 12 + day.month - 1


def period_start(window: Window, now: float) -> float:
    """Return when the calendar period (UTC) containing ``now`` began, in epoch seconds."""
    day = dt.datetime.fromtimestamp(now, dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if window is Window.MONTH:
        day = day.replace(day=1)
    return day.timestamp()


def period_end(window: Window, now: float) -> float:
    """Return when the calendar period (UTC) containing ``now`` ends, in epoch seconds."""
    day = dt.datetime.fromtimestamp(now, dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if window is Window.DAY:
        end = day + dt.timedelta(days=1)
    elif day.month == 12:
        end = day.replace(year=day.year + 1, month=1, day=1)
    else:
        end = day.replace(month=day.month + 1, day=1)
    return end.timestamp()


@dataclass
class _Rolling:
    """One key's last minute, by the second."""

    buckets: deque[list[float]] = field(default_factory=deque)  # [second, amount], oldest first
    total: float = 0.0

    def used(self, now: float) -> float:
        horizon = int(now) - _MINUTE
        buckets = self.buckets
        while buckets and buckets[0][0] <= horizon:
            self.total -= buckets.popleft()[1]
        if not buckets:
            self.total = 0.0  # no float residue once the window is empty
        return self.total

    def add(self, now: float, amount: float) -> int:
        second = int(now)
        if self.buckets and self.buckets[-1][0] == second:
            self.buckets[-1][1] += amount
        else:
            self.buckets.append([second, amount])
        self.total += amount
        return second

    def adjust(self, second: int, delta: float, now: float) -> None:
        """Change what was granted in ``second``, if that second is still in the window."""
        self.used(now)
        for bucket in reversed(self.buckets):  # recent grants settle most: look there first
            if bucket[0] == second:
                change = max(delta, -bucket[1])
                bucket[1] += change
                self.total += change
                return
            if bucket[0] < second:
                return

    def retry_after(self, limit: float, now: float) -> float:
        """Seconds until enough buckets leave the window for the used amount to drop below."""
        used = self.used(now)
        for second, amount in self.buckets:
            used -= amount
            if used < limit:
                return max(second + _MINUTE - now, 0.0)
        return float(_MINUTE)

    def empty(self, now: float) -> bool:
        self.used(now)
        return not self.buckets


@dataclass
class _Calendar:
    """One key's current UTC day or month (its bounds kept: no date arithmetic per call)."""

    window: Window
    period: int = -1
    start: float = 0.0
    end: float = 0.0
    total: float = 0.0

    def used(self, now: float) -> float:
        if not self.start <= now < self.end:
            self.period = period_of(self.window, now)
            self.end = period_end(self.window, now)
            self.start = period_start(self.window, now)
            self.total = 0.0
        return self.total

    def add(self, now: float, amount: float) -> int:
        self.used(now)
        self.total += amount
        return self.period

    def adjust(self, period: int, delta: float, now: float) -> None:
        self.used(now)
        if period == self.period:
            self.total = max(self.total + delta, 0.0)

    def retry_after(self, limit: float, now: float) -> float:
        self.used(now)
        return max(self.end - now, 0.0)

    def empty(self, now: float) -> bool:
        return not self.start <= now < self.end or self.total == 0.0


_Counter = _Rolling | _Calendar


class LocalBook:
    """Counters of one process (see the module's docstring); not shared by replicas."""

    def __init__(self) -> None:
        self._counters: dict[LimitKey, _Counter] = {}
        self._next_sweep = 0.0
        self._unswept: list[LimitKey] = []  # the keys the current sweep has still to check

    def __len__(self) -> int:
        """Return how many counters are held (for the bounded-memory check)."""
        return len(self._counters)

    def _counter(self, key: LimitKey) -> _Counter:
        counter = self._counters.get(key)
        if counter is None:
            counter = _Rolling() if key.window is Window.MINUTE else _Calendar(key.window)
            self._counters[key] = counter
        return counter

    # -- synchronous (the dispatcher's loop) -----------------------------------------------

    def reserve_now(self, uses: Sequence[LimitUse], now: float) -> Grant | Refusal:
        """Grant every use or none: refused if a key's used amount reached its limit."""
        if self._unswept or now >= self._next_sweep:
            self._sweep_some(now)
        counters = [self._counter(use.key) for use in uses]
        for use, counter in zip(uses, counters, strict=True):
            used = counter.used(now)
            if used >= use.limit:
                return Refusal(use, used, counter.retry_after(use.limit, now))
        slots = tuple(c.add(now, use.amount) for use, c in zip(uses, counters, strict=True))
        return Grant(token=slots, uses=tuple(uses), used=tuple(c.total for c in counters))

    def settle_now(self, grant: Grant, actual: Sequence[float], now: float) -> None:
        """Replace each reserved amount by the actual one, in the slot it was granted in.

        A slot that has left its window meanwhile (a request longer than a minute, or one
        that ran over midnight) is not changed: its amount no longer counts anywhere.
        """
        slots = grant.token
        assert isinstance(slots, tuple)
        for use, slot, amount in zip(grant.uses, slots, actual, strict=True):
            if amount == use.amount:
                continue
            counter = self._counters.get(use.key)
            if counter is not None:
                counter.adjust(slot, amount - use.amount, now)

    def used_now(self, keys: Sequence[LimitKey], now: float) -> list[float]:
        """Return each key's used amount in its current window (0 for a key never used)."""
        out: list[float] = []
        for key in keys:
            counter = self._counters.get(key)
            out.append(0.0 if counter is None else counter.used(now))
        return out

    def sweep(self, now: float) -> int:
        """Drop every counter whose window holds nothing; return how many were dropped."""
        self._next_sweep = now + _SWEEP_EVERY
        self._unswept = []
        dead = [key for key, counter in self._counters.items() if counter.empty(now)]
        for key in dead:
            del self._counters[key]
        return len(dead)

    def _sweep_some(self, now: float) -> None:
        """Check the next slice of the sweep (starting one if it is due)."""
        if not self._unswept:
            self._next_sweep = now + _SWEEP_EVERY
            self._unswept = list(self._counters)
        for _ in range(min(_SWEEP_SLICE, len(self._unswept))):
            key = self._unswept.pop()
            counter = self._counters.get(key)
            if counter is not None and counter.empty(now):
                del self._counters[key]

    # -- the LimitBook protocol --------------------------------------------------------------

    async def reserve(self, uses: Sequence[LimitUse], now: float) -> Grant | Refusal:
        """See :meth:`LimitBook.reserve`."""
        return self.reserve_now(uses, now)

    async def settle(self, grant: Grant, actual: Sequence[float]) -> None:
        """See :meth:`LimitBook.settle` (slots are found by the second granted in)."""
        self.settle_now(grant, actual, time.time())

    async def used(self, keys: Sequence[LimitKey], now: float) -> list[float]:
        """See :meth:`LimitBook.used`."""
        return self.used_now(keys, now)
