"""The dispatcher's state for one model: its queue, queue time-to-live and tier aging."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from fairq_server.config.tiers import TierConfig
from fairq_server.scheduling.queue import ModelQueue
from fairq_server.scheduling.ticket import Ticket, TicketState
from fairq_server.telemetry import Telemetry

__all__ = ["ModelState"]


class ModelState:
    """One model's queue and the bookkeeping around it (written by the dispatcher only)."""

    def __init__(
        self, name: str, queue: ModelQueue, tiers: Sequence[TierConfig], telemetry: Telemetry,
        now: float,
    ) -> None:  # fmt: skip
        self.name = name
        self.queue = queue
        # Tickets in arrival order, for the queue time-to-live (stale entries are skipped).
        self.arrivals: deque[Ticket] = deque()
        # When each tier last dispatched, or last went from empty to backlogged (aging).
        self.last_served = [now] * len(tiers)
        self._depth = [telemetry.queue_depth.labels(name, t.name) for t in tiers]
        self._published = [-1] * len(tiers)
        # Since when none of the model's backends is serving (None: one is).
        self.orphaned_since: float | None = None

    def push(self, ticket: Ticket, now: float, *, ttl: bool, front: bool = False) -> int:
        """Queue ``ticket``; return its estimated position."""
        if not front and not len(self.queue.tiers[ticket.tier]):
            self.last_served[ticket.tier] = now
        position = self.queue.push(ticket, front=front)
        if ttl:
            if front:
                self.arrivals.appendleft(ticket)  # among the oldest by arrival
            else:
                self.arrivals.append(ticket)
        return position

    def resume(self, ticket: Ticket, *, ttl: bool) -> None:
        """Queue again a request the cluster's shared gate refused.

        It goes among its user's requests (not ahead of its tier, as a retry would), and its
        user keeps its fairness standing (no lift).
        """
        self.queue.push(ticket, resume=True)
        if ttl:
            self.arrivals.appendleft(ticket)  # among the oldest by arrival

    def expire(self, deadline: float | None) -> list[Ticket]:
        """Dequeue and return the tickets that arrived before ``deadline`` (None: no TTL)."""
        arrivals = self.arrivals
        if deadline is None:
            arrivals.clear()
            return []
        expired = []
        # The head is either no longer queued (dispatched or released: just forget it) or the
        # oldest queued ticket; stop at the first one still within its time.
        while arrivals and (
            arrivals[0].state is not TicketState.QUEUED or arrivals[0].arrival <= deadline
        ):
            ticket = arrivals.popleft()
            if ticket.state is TicketState.QUEUED:
                self.queue.remove(ticket)
                expired.append(ticket)
        return expired

    def aged_tier(self, first: int, now: float, tiers: Sequence[TierConfig]) -> int:
        """Return a lower tier whose aging bound is due, or ``first``."""
        for tier in range(len(tiers) - 1, first, -1):
            aging = tiers[tier].aging_seconds
            if (
                aging is not None
                and len(self.queue.tiers[tier])
                and now - self.last_served[tier] >= aging
            ):
                return tier
        return first

    def take_all(self) -> list[Ticket]:
        """Dequeue every ticket, in arrival order."""
        taken = []
        for tier in range(len(self.queue.tiers)):
            while len(self.queue.tiers[tier]):
                taken.append(self.queue.pop(tier, start=False))
        return sorted(taken, key=lambda t: t.seq)

    def update_depth(self) -> None:
        """Publish the queue depth per tier, where it changed.

        This runs every dispatcher pass for every model, and most queues do not change in a
        given pass.
        """
        for i, tier in enumerate(self.queue.tiers):
            depth = len(tier)
            if depth != self._published[i]:
                self._depth[i].set(depth)
                self._published[i] = depth
