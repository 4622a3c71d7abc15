"""Round-robin: one request per backlogged user per turn."""

from __future__ import annotations

from fairq_server.scheduling.fairness.counter import CounterFairness
from fairq_server.scheduling.interfaces import Cost

__all__ = ["RoundRobinFairness"]


class RoundRobinFairness(CounterFairness):
    """The counter counts dispatched requests, regardless of weight or tokens."""

    def charge(self, user: str, cost: Cost, weight: float | None = None) -> None:
        """Charge one unit per dispatched request; weights do not apply to turns."""
        super().charge(user, cost, 1.0)

    def price(self, cost: Cost) -> float:
        """One unit per request."""
        return float(cost.requests)
