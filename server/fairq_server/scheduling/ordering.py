"""Order of the requests inside one user's queue."""

from __future__ import annotations

from fairq_server.scheduling.interfaces import SortKey
from fairq_server.scheduling.ticket import Ticket

__all__ = ["FifoOrdering", "ShortestFirstOrdering"]


class FifoOrdering:
    """First in, first out (the queue's arrival tie-break does the work)."""

    def key(self, ticket: Ticket) -> SortKey:
        """All tickets are equal; arrival order decides."""
        return ()


class ShortestFirstOrdering:
    """Cheapest first: estimated cost = prompt tokens + ``max_tokens``.

    Serving a user's short requests first lowers that user's mean latency without touching
    what other users get, since fairness between users is decided before this ordering.
    """

    def key(self, ticket: Ticket) -> SortKey:
        """Smaller estimated cost first."""
        return (float(ticket.cost),)
