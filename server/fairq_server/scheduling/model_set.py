"""Every model's state, by name, and what happens to queued requests as time passes.

The dispatcher owns one :class:`ModelSet` and is its only writer. The set creates a model's
state when a backend first serves it, rebuilds queues on a policy change, and hands back the
tickets that must be answered (timed out, orphaned, or failed with the loop); answering them
stays the dispatcher's, which knows how.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from fairq_server.config.tiers import TierConfig
from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.model_state import ModelState
from fairq_server.scheduling.queue import ModelQueue
from fairq_server.scheduling.ticket import Ticket, TicketState
from fairq_server.telemetry import Telemetry

__all__ = ["ModelSet"]

log = logging.getLogger(__name__)


class ModelSet(dict[str, ModelState]):
    """Model name to :class:`ModelState` (a dict, plus the set-wide operations)."""

    def __init__(self, telemetry: Telemetry) -> None:
        super().__init__()
        self._telemetry = telemetry

    def ensure(
        self, name: str, new_queue: Callable[[], ModelQueue], tiers: Sequence[TierConfig],
        now: float,
    ) -> None:  # fmt: skip
        """Create ``name``'s state if it has none."""
        if name not in self:
            self[name] = ModelState(name, new_queue(), tiers, self._telemetry, now)

    def rebuild(self, new_queue: Callable[[], ModelQueue]) -> None:
        """Move every queued ticket to a fresh queue (arrival order kept; retries first)."""
        for model in self.values():
            tickets = model.take_all()
            model.queue = new_queue()
            for ticket in tickets:
                model.queue.push(ticket, front=ticket.retries > 0)

    def expire(self, deadline: float | None) -> list[Ticket]:
        """Dequeue and return every ticket that arrived before ``deadline`` (None: no TTL)."""
        return [t for model in self.values() for t in model.expire(deadline)]

    def sweep(
        self, now: float, grace: float, backends_of: Callable[[str], list[BackendState]]
    ) -> list[tuple[ModelState, list[Ticket]]]:
        """Return what waits for a model no backend can serve; forget a model nothing serves.

        A model none of whose backends is serving (all down or draining, or none left) keeps
        its queue for ``grace`` seconds, so a backend restarting within it fails nobody; then
        its queued tickets are dequeued and returned with the model. A model without backends
        and without queued requests is forgotten, with its metric series.
        """
        orphaned = []
        for model in list(self.values()):
            backends = backends_of(model.name)
            if any(b.serving for b in backends):
                model.orphaned_since = None
                continue
            if model.orphaned_since is None:
                model.orphaned_since = now
            if len(model.queue) and now - model.orphaned_since >= grace:
                orphaned.append((model, model.take_all()))
                model.arrivals.clear()
            if not backends and not len(model.queue):
                del self[model.name]
                self._telemetry.forget_model(model.name)
        return orphaned

    def take_queued(self, new_queue: Callable[[], ModelQueue]) -> list[Ticket]:
        """Dequeue every queued ticket of every model (the loop crashed or is closing).

        A queue broken by the fault itself is rebuilt empty; its tickets are still in the
        arrivals list where a TTL is set.
        """
        taken = []
        for model in self.values():
            try:
                tickets = model.take_all()
            except Exception:
                log.exception("queue of model %s unreadable; rebuilt empty", model.name)
                tickets = [t for t in model.arrivals if t.state is TicketState.QUEUED]
                model.queue = new_queue()
            model.arrivals.clear()
            taken.extend(tickets)
            model.update_depth()
        return taken
