"""Plugin boundaries of the scheduler.

Dispatch picks work in steps, each behind one of these protocols:

1. tier (strict order, in :mod:`fairq_server.scheduling.queue`),
2. a :class:`FairnessPolicy` chooses which backlogged user goes next inside a tier,
3. an :class:`OrderingPolicy` orders the requests of one user,
4. a :class:`Gate` says whether a backend may take one more request of a tier now,
5. a :class:`Router` chooses among the backends whose gate is open.

A fairness policy keeps its users' standing in :class:`ServiceCounters` given to it at
construction: that is the state a cluster shares between replicas (see
:mod:`fairq_server.scheduling.counters`), so any policy that keeps its counters there is fair
across the cluster without code of its own for it.

Plugins are driven only by the dispatcher, so they need no locking. Each is registered under
a kebab-case name in :mod:`fairq_server.scheduling.registry` and takes its options, from its
own table of the configuration, as keyword arguments; one conformance suite per protocol
(``tests/unit/scheduling/test_conformance.py``) runs against every registered plugin.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from fairq_server.config.tiers import TierConfig
    from fairq_server.scheduling.backend_state import BackendState
    from fairq_server.scheduling.ticket import Ticket

__all__ = [
    "Cost",
    "FairnessPolicy",
    "Gate",
    "GateOutcome",
    "OrderingPolicy",
    "Route",
    "Router",
    "ServiceCounters",
    "SortKey",
    "TracksRunning",
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


class ServiceCounters(Protocol):
    """Per-user service counters of one tier, in a fairness policy's units.

    How much each user has been served (requests, weighted tokens, ...): smaller is further
    behind. On one process a plain table; in a cluster every replica's table is kept equal
    through Redis (charges add up over the replicas, a lift is "at least"), and the dispatcher
    holds back a user whose counter is above anyone's backlogged on another replica. A policy
    reads and writes its users' standing only here, and keeps a user's record as long as it
    keeps the user (:meth:`forget` when it drops it).
    """

    @property
    def shared(self) -> bool:
        """Whether other replicas share these counters (users are served elsewhere too)."""
        ...

    def get(self, user: str) -> float | None:
        """Return ``user``'s counter (None: no record)."""
        ...

    def lift(self, user: str, floor: float) -> None:
        """Raise ``user``'s counter to at least ``floor``; a user without a record starts there."""
        ...

    def add(self, user: str, amount: float) -> None:
        """Charge ``amount`` (already divided by the weight; negative: a refund).

        A user without a record here keeps none; in a cluster the charge still counts for the
        other replicas.
        """
        ...

    def forget(self, user: str) -> None:
        """Drop ``user``'s record here (memory); a shared counter stays where it is shared."""
        ...

    def floor(self, user: str) -> float | None:
        """Return the smallest counter of another user backlogged on another replica.

        A user becoming backlogged is lifted to no more than this (a policy that lifts), so
        idle time is not banked against users waiting elsewhere. None: nobody (always on one
        process).
        """
        ...

    def watch(self, changed: Callable[[str], None]) -> None:
        """Call ``changed(user)`` whenever a counter changes from outside (a cluster sync)."""
        ...


class FairnessPolicy(Protocol):
    """Chooses among the backlogged users of one tier.

    Its factory takes its options as keyword arguments and, if it has a ``counters``
    parameter, the tier's :class:`ServiceCounters` (the registry passes them; that name is no
    option). A policy that keeps its users' standing there gets cluster fairness for free.

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


@runtime_checkable
class TracksRunning(Protocol):
    """A fairness policy that also hears which users have requests running (optional).

    The queue calls :meth:`started` when it hands a user's request to a backend (before it
    reports the user idle, if that was its last queued request) and :meth:`stopped` when the
    request ends or comes back to the queue. A user with requests running is not idle: a
    closed-loop caller's queue empties at every dispatch, yet it is about to send again. A
    policy without these methods is told instead through ``activate(..., resume=True)``
    when a user with requests running becomes backlogged again.
    """

    def started(self, user: str) -> None:
        """Note that a request of ``user`` was dispatched."""
        ...

    def stopped(self, user: str) -> None:
        """Note that a request of ``user`` ended, or went back to the queue."""
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
