"""Logging a recurring event without flooding the log: the first line, then one per interval.

A line that repeats per request (a refused token, a database that stays away) would write
thousands of lines a minute; :class:`Throttled` writes the first at once and then at most one
per interval, saying how many it held back since the last.
"""

from __future__ import annotations

import logging

from fairq_server.runtime.clock import SYSTEM_CLOCK, Clock

__all__ = ["Throttled"]


class Throttled:
    """Logs one recurring event to ``logger`` at most once per ``interval`` seconds.

    Args:
        interval: seconds between two lines.
        logger: where the lines go.
        clock: what the interval is measured on.

    """

    def __init__(
        self, interval: float, logger: logging.Logger, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._clock = clock
        self._interval = interval
        self._logger = logger
        self._last = -float("inf")
        self._suppressed = 0

    def log(self, level: int, message: str, *args: object) -> None:
        """Log ``message`` unless a line went out less than an interval ago (then count it)."""
        now = self._clock.monotonic()
        if now - self._last < self._interval:
            self._suppressed += 1
            return
        extra = f" ({self._suppressed} more since the last report)" if self._suppressed else ""
        self._logger.log(level, message + extra, *args)
        self._last, self._suppressed = now, 0

    def warning(self, message: str, *args: object) -> None:
        """:meth:`log` at WARNING."""
        self.log(logging.WARNING, message, *args)
