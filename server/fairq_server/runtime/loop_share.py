"""Sharing fairq's event loop between bulk work and everything else.

All of fairq runs on one asyncio loop, and asyncio runs every callback that became ready in
one pass before it polls its sockets and timers again. A continuous-batching backend emits a
token for every running sequence in the same engine step, so with 2,000 streams 2,000 reads
become ready together; relaying them in one pass (tens to hundreds of microseconds each) holds
the loop for a quarter of a second or more, and a health check, a new call or a scrape that
arrives meanwhile waits for all of it.

Bulk work (reading a backend's stream, starting a backend request) therefore takes a *turn*
first. Turns are granted at once until :data:`SLICE_SECONDS` have passed since the first one
of the current epoch; later ones wait, first come first served, for later epochs. An epoch
ends with a callback queued behind the work it granted, so between two epochs the loop always
completes a pass and polls its sockets and timers. A burst is spread over several passes of
about one slice of bulk work each, and the latency-sensitive work in between waits about a
slice instead of the whole burst. An idle loop pays one clock read per turn.

One :class:`LoopShare` serves a loop: the process makes it at assembly and hands it to all
bulk work, the doors' writers and the backends' readers
(:class:`~fairq_server.runtime.loop_tools.LoopTools`).

A stream's *first* pieces of work (opening the backend request, its first read, the first
write towards the caller) are asked for as *urgent* turns: they go to the head of the line
instead of its end. They are few (a handful per request, against one per token for the
rest), and they are what a new request's time to first token waits for: behind a line of
reads of running streams, a first token under load waited for every epoch of that line.
Urgent turns still take their share of the slice, so a wave of new requests is spread over
passes as before.
"""

from __future__ import annotations

import asyncio
from collections import deque

from fairq_server.runtime.clock import SYSTEM_CLOCK, Clock

__all__ = ["SLICE_SECONDS", "LoopShare"]

#: Wall time one epoch may spend on bulk work before the rest waits for a later pass. Short
#: enough that a health check waiting behind a burst is answered within a few slices, long
#: enough that the per-epoch bookkeeping (one callback, one future per waiter) stays small.
SLICE_SECONDS = 0.005
# The most waiters one epoch wakes after an epoch with time to spare (~2 ms of refusals if
# none of them fits).
_MAX_BATCH = 64


class LoopShare:
    """Grants turns of bulk work on the running loop, at most ``slice_seconds`` per epoch.

    Waiters are served in arrival order; a waiter woken for an epoch that is already used up
    goes back to the head of the line. Every epoch wakes as many waiters as the last full
    epoch granted turns (twice as many after an epoch that had time to spare), so a long line
    costs about one wake-up per turn, not one per epoch.

    Args:
        slice_seconds: the time one epoch may spend on bulk work.
        clock: what the slice is measured on.

    """

    def __init__(self, slice_seconds: float = SLICE_SECONDS, clock: Clock = SYSTEM_CLOCK) -> None:
        self._slice = slice_seconds
        self._now = clock.monotonic  # bound once: read at every turn
        self._open = False  # an epoch has started (a turn was granted since the last boundary)
        self._opened = 0.0  # the clock's time at its first turn
        self._granted = 0  # turns granted in it
        self._full = False  # the current epoch refused a turn: its slice is used up
        self._batch = 1  # waiters to wake per epoch: how many turns the last full one held
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._returned = 0  # woken waiters put back at the head of the line in this epoch
        self._boundary: asyncio.Handle | None = None

    @property
    def waiting(self) -> int:
        """Turns waiting for a later epoch (cancelled ones included until skipped)."""
        return len(self._waiters)

    @property
    def backlogged(self) -> bool:
        """Whether bulk work is waiting for a later pass (the loop is behind)."""
        return bool(self._waiters)

    async def turn(self, urgent: bool = False) -> None:
        """Return when the caller may run its next piece of bulk work.

        Returns without suspending while the current epoch has time left and nobody waits
        (an ``urgent`` turn: while the epoch has time left, whoever waits).
        """
        if (self._waiters and not urgent) or not self._grant():
            await self._wait(urgent)

    def _grant(self) -> bool:
        now = self._now()
        if not self._open:
            self._open, self._opened, self._granted, self._full = True, now, 0, False
            self._schedule_boundary()
        elif now - self._opened >= self._slice:
            self._full = True
            self._batch = max(1, self._granted)
            return False
        self._granted += 1
        return True

    async def _wait(self, urgent: bool) -> None:
        loop = asyncio.get_running_loop()
        first = True
        while True:
            waiter: asyncio.Future[None] = loop.create_future()
            if first and not urgent:
                self._waiters.append(waiter)
            else:  # woken but the epoch was used up before this task ran (keep its place),
                # or urgent: at the head, behind those already put back there
                self._waiters.insert(self._returned, waiter)
                self._returned += 1
            self._schedule_boundary()
            # A cancelled waiter stays in the line, done; the boundary skips it.
            await waiter
            if self._grant():
                return
            first = False

    def _schedule_boundary(self) -> None:
        if self._boundary is None:
            self._boundary = asyncio.get_running_loop().call_soon(self._next_epoch)

    def _next_epoch(self) -> None:
        self._boundary = None
        if self._open and not self._full and self._waiters:
            # The epoch ending had time for more than it was given. Growth is capped: waking
            # more than fit costs each extra waiter a wasted step when it is refused.
            self._batch = min(2 * self._batch, _MAX_BATCH)
        self._open = False
        self._returned = 0
        woken = 0
        while self._waiters and woken < self._batch:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                woken += 1
        if self._waiters:
            self._schedule_boundary()
