"""What every part sharing fairq's event loop is handed: the clock, the time-slicer, the pace.

The process makes one :class:`LoopTools` at assembly (:class:`~fairq_server.core.FairqCore`)
and passes it down: the doors take their writers' turns on its share, the backends' readers
take theirs and pace on its pace, the outboxes pace on it, the loop monitor writes the pace
from the share's backlog and the clock's CPU time. Objects passed in, not module globals:
a test builds its own with a fake clock (``tests/fakeclock.py``) and moves time by hand.
"""

from __future__ import annotations

from fairq_server.runtime.clock import SYSTEM_CLOCK, Clock
from fairq_server.runtime.loop_share import LoopShare
from fairq_server.runtime.pace import Pace

__all__ = ["LoopTools"]


class LoopTools:
    """One event loop's shared helpers.

    Args:
        clock: the time every part reads and waits on.
        share: bulk work's turns on the loop (:mod:`~fairq_server.runtime.loop_share`;
            a fresh one on ``clock`` if None).
        pace: the coalescing window's stretch (:mod:`~fairq_server.runtime.pace`; a fresh
            one if None).

    """

    __slots__ = ("clock", "pace", "share")

    def __init__(
        self, clock: Clock = SYSTEM_CLOCK, share: LoopShare | None = None, pace: Pace | None = None
    ) -> None:
        self.clock = clock
        self.share = share if share is not None else LoopShare(clock=clock)
        self.pace = pace if pace is not None else Pace()
