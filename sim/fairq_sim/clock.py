"""Clocks for the engine: real monotonic time, or a manual one for tests and offline runs."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Clock", "ManualClock"]

Clock = Callable[[], float]
"""A zero-argument callable returning seconds (monotonic)."""


class ManualClock:
    """A clock that only moves when told to.

    Args:
        start: Initial reading in seconds.

    """

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        """Return the current reading."""
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (must not be negative)."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self.now += seconds
