"""Routing: which of the backends whose gate is open gets a request.

With one backend per model there is nothing to choose. With several, prefix affinity sends a
request where its prompt's leading blocks were sent recently (the backend's KV cache likely
still holds them), bounded by load so affinity cannot pile work onto one backend.
"""

from __future__ import annotations

from collections.abc import Sequence

from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.gate import estimated_waiting
from fairq_server.scheduling.interfaces import Route
from fairq_server.scheduling.ticket import Ticket

__all__ = ["LeastLoadedRouter", "PrefixAffinityRouter"]


def _load_key(backend: BackendState) -> tuple[float, int, str]:
    # The id last: equal loads are broken the same way every time.
    return estimated_waiting(backend), backend.in_flight, backend.id


class LeastLoadedRouter:
    """The backend with the shortest estimated queue, then the fewest requests in flight."""

    def route(self, ticket: Ticket, candidates: Sequence[BackendState]) -> Route:
        """See :meth:`fairq_server.scheduling.interfaces.Router.route`."""
        return Route(min(candidates, key=_load_key))


class PrefixAffinityRouter:
    """Longest remembered prefix among backends within ``slack`` requests of the least loaded.

    Args:
        slack: a backend may be chosen for its prefix with at most this many more requests in
            flight than the least loaded candidate.

    """

    def __init__(self, *, slack: int = 2) -> None:
        if slack < 0:
            raise ValueError(f"slack must be >= 0, not {slack!r}")
        self.slack = slack

    def route(self, ticket: Ticket, candidates: Sequence[BackendState]) -> Route:
        """See :meth:`fairq_server.scheduling.interfaces.Router.route`."""
        if len(candidates) == 1:
            only = candidates[0]
            return Route(only, only.prefixes.match(ticket.prefix))
        least = min(c.in_flight for c in candidates)
        best: tuple[tuple[float, ...], Route] | None = None
        for backend in candidates:
            if backend.in_flight > least + self.slack:
                continue
            match = backend.prefixes.match(ticket.prefix)
            key = (-match, *_load_key(backend)[:2])
            if best is None or key < best[0]:
                best = (key, Route(backend, match))
        assert best is not None, "the least loaded candidate is always near"
        return best[1]
