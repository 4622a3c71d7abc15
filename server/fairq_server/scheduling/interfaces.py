"""Plugin boundaries of the scheduler.

Dispatch picks work in steps, each behind one of these protocols:

1. tier (strict order, in :mod:`fairq_server.scheduling.queue`),
2. a :class:`FairnessPolicy` chooses which backlogged user goes next inside a tier,
3. an :class:`OrderingPolicy` orders the requests of one user,
4. a :class:`Gate` says whether a backend may take one more request of a tier now,
5. a :class:`Router` chooses among the backends whose gate is open.

Plugins are driven only by the dispatcher, so they need no locking. Each is registered under
a kebab-case name in :mod:`fairq_server.scheduling.registry`; one conformance suite per
protocol (``tests/unit/scheduling/test_conformance.py``) runs against every registered plugin.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fairq_server.config import TierConfig
    from fairq_server.scheduling.backend_state import BackendState
    from fairq_server.scheduling.ticket import Ticket

__all__ = [
    "Cost",
    "FairnessPolicy",
    "FairnessView",
    "Gate",
    "GateOutcome",
    "OrderingPolicy",
    "Route",
    "Router",
    "SortKey",
]

SortKey = tuple[float, ...]


@dataclass(frozen=True)
class Cost:
    """Service to charge to a user: requests dispatched and tokens processed.

    Token counts may be negative when an estimate charged earlier is settled against the
    backend's own count.
    """

    requests: int = 0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0


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
    non-empty and :meth:`deactivate` when it becomes empty; :meth:`select` and
    :meth:`candidates` are only called while at least one user is active and return active
    users. Charges may arrive for any user at any time (tokens keep streaming after a user's
    queue has emptied).
    """

    def activate(self, user: str, weight: float, *, resume: bool = False) -> None:
        """Mark ``user`` backlogged (its queue went from empty to non-empty).

        ``resume``: its queue emptied only because its last request was taken a moment ago,
        and that request is back (the cluster's shared gate refused it): the user keeps its
        standing, as if it had never left.
        """
        ...

    def deactivate(self, user: str) -> None:
        """Mark ``user`` idle (its queue became empty)."""
        ...

    def select(self) -> str:
        """Return the active user to serve next. O(log n) amortised."""
        ...

    def candidates(self, quantum: float, limit: int) -> list[str]:
        """Return up to ``limit`` active users whose standing is within ``quantum`` of the best.

        They come in the order :meth:`select` would serve them, so the first is what
        :meth:`select` returns (prefix grouping may serve any of them instead). A policy
        without a notion of distance returns ``[select()]``.
        """
        ...

    def charge(self, user: str, cost: Cost, weight: float | None = None) -> None:
        """Account for service given to ``user``.

        ``weight`` is the weight of the request it belongs to (None: the user's current
        one); it travels with the charge because the user may have gone idle meanwhile.
        """
        ...


class FairnessView(Protocol):
    """Read-only counters of a counter-based policy, for tests, metrics and tools."""

    def counter(self, user: str) -> float:
        """Return the user's service counter."""
        ...

    def min_counter(self) -> float:
        """Return the smallest counter among active users (0 when none is active)."""
        ...


class GateOutcome(enum.Enum):
    """Result of a gate check; the value doubles as a metric label."""

    ADMIT = "admit"
    NO_METRICS = "no_metrics"
    UNHEALTHY = "unhealthy"
    STALE = "stale"
    WAITING = "waiting"
    TPOT = "tpot"
    KV_CACHE = "kv_cache"
    IN_FLIGHT = "in_flight"
    TIER_IN_FLIGHT = "tier_in_flight"
    RESERVED = "reserved"
    DRAINING = "draining"


class Gate(Protocol):
    """Saturation check: whether a backend may take one more request of a tier now.

    A pure function of the backend's state. Missing or stale metrics, an unhealthy or a
    draining backend are never admitted (fail closed).
    """

    def check(
        self, backend: BackendState, tier: TierConfig, now: float, stale_after: float
    ) -> GateOutcome:
        """Return :attr:`GateOutcome.ADMIT` or the reason for refusing."""
        ...


@dataclass(frozen=True)
class Route:
    """A routing decision: the backend, and how many leading prefix blocks it remembers."""

    backend: BackendState
    affinity: int = 0


class Router(Protocol):
    """Chooses the backend for a request among those whose gate is open."""

    def route(self, ticket: Ticket, candidates: Sequence[BackendState]) -> Route:
        """Return one of ``candidates`` (never empty) for ``ticket``. Deterministic."""
        ...
