"""Plugin boundaries of the scheduler.

Dispatch picks work in three steps, each behind one of these protocols:

1. tier (strict order, in :mod:`fairq_server.scheduling.queue`),
2. a :class:`FairnessPolicy` chooses which backlogged user goes next inside a tier,
3. an :class:`OrderingPolicy` orders the requests of one user.

Policies are driven only by the dispatcher, so they need no locking.
"""

from __future__ import annotations

from typing import Protocol

from fairq_server.scheduling.ticket import Ticket

__all__ = ["FairnessPolicy", "OrderingPolicy", "SortKey"]

SortKey = tuple[float, ...]


class OrderingPolicy(Protocol):
    """Orders the queued requests of a single user. Stateless."""

    def key(self, ticket: Ticket) -> SortKey:
        """Return the sort key of ``ticket``; smaller keys are served first.

        The queue appends the ticket's arrival sequence number as the final tie-break, so
        equal keys are served in arrival order.
        """
        ...


class FairnessPolicy(Protocol):
    """Chooses among the backlogged users of one tier.

    Contract: the queue calls :meth:`activate` when a user's queue goes from empty to
    non-empty and :meth:`deactivate` when it becomes empty; :meth:`select` is only called
    while at least one user is active and returns an active user. Charges may arrive for any
    user at any time (tokens keep streaming after a user's queue has emptied).
    """

    def activate(self, user: str, weight: float) -> None:
        """Mark ``user`` backlogged (its queue went from empty to non-empty)."""
        ...

    def deactivate(self, user: str) -> None:
        """Mark ``user`` idle (its queue became empty)."""
        ...

    def select(self) -> str:
        """Return the active user to serve next. O(log n) amortised."""
        ...

    def charge_dispatch(self, ticket: Ticket) -> None:
        """Account for ``ticket`` having been dispatched."""
        ...

    def charge_tokens(
        self, user: str, prompt_tokens: int, completion_tokens: int, weight: float | None = None
    ) -> None:
        """Account for tokens the backend processed for ``user``.

        ``weight`` is the weight of the request they belong to (None: the user's current one);
        it travels with the charge because the user may have gone idle meanwhile.
        """
        ...

    def counter(self, user: str) -> float:
        """Return the user's service counter (for tests, metrics and prefix grouping)."""
        ...

    def candidates(self, quantum: float, limit: int) -> list[str]:
        """Return up to ``limit`` active users within ``quantum`` of the minimum counter.

        They come in the order :meth:`select` would serve them. O(limit log n).
        """
        ...

    def min_counter(self) -> float:
        """Return the smallest counter among active users (0 when none is active)."""
        ...
