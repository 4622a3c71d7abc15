"""Backpressure: whether a backend may take one more request of a given tier right now.

The gate is a pure function of the poller's latest snapshot and the dispatcher's own counts.
fairq knows its own share of the backend's queue better than any scrape: a request it sent that
has not produced a token yet is waiting (or travelling there, or in prefill), and one that has
is running. So the estimate is fairq's own tokenless requests, counted live, plus the waiting
requests of *other* clients as of the last scrape (the scraped count minus fairq's tokenless
requests when the scrape was sent). A slot freed by a finishing request is refilled as soon as
the backend starts the next one (its first token), not at the next scrape, so the poll
interval does not pace dispatch. Missing or stale metrics count as saturated (fail closed).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from fairq_server.config import TierConfig

__all__ = ["BackendLoad", "GateOutcome", "MetricsSnapshot", "admit", "estimated_waiting"]


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


@dataclass(frozen=True)
class MetricsSnapshot:
    """What one scrape of a backend's ``/metrics`` said.

    Attributes:
        taken_at: monotonic time the scrape was sent.
        waiting: requests waiting in the backend's own queue.
        running: requests the backend is running.
        kv_usage: KV-cache usage 0-1, if the backend reports it.
        tpot_seconds: mean time per output token since the previous scrape, None if no token
            was produced in between.
        awaiting_mark: fairq's requests to this backend without a token yet when the scrape
            was sent (the part of ``waiting`` that is fairq's own).

    """

    taken_at: float
    waiting: float
    running: float
    kv_usage: float | None = None
    tpot_seconds: float | None = None
    awaiting_mark: int = 0


@dataclass
class BackendLoad:
    """Live load of one backend, as the gate sees it.

    ``dispatched`` and ``finished`` only grow; the dispatcher writes them, the poller writes
    ``snapshot``. ``healthy`` goes False when a scrape fails or a request could not reach the
    backend, and True again with the next successful scrape.
    """

    snapshot: MetricsSnapshot | None = None
    dispatched: int = 0
    finished: int = 0
    in_flight: int = 0
    awaiting_first_token: int = 0
    healthy: bool = True
    tier_in_flight: dict[str, int] = field(default_factory=dict)
    max_in_flight: int = 0
    draining: bool = False


def estimated_waiting(load: BackendLoad) -> float:
    """Other clients' waiting requests at the last scrape + fairq's own tokenless ones now."""
    snap = load.snapshot
    if snap is None:
        return float("inf")
    # Clamped: a request of ours that got its first token between the scrape being sent and
    # the backend answering it is in the mark but no longer in the scraped count.
    others = max(0.0, snap.waiting - snap.awaiting_mark)
    return others + load.awaiting_first_token


def admit(load: BackendLoad, tier: TierConfig, now: float, stale_after: float) -> GateOutcome:
    """Decide whether ``load``'s backend may take one more request of ``tier`` at ``now``."""
    if load.draining:
        return GateOutcome.DRAINING
    if not load.healthy:
        return GateOutcome.UNHEALTHY
    if load.max_in_flight and load.in_flight >= load.max_in_flight:
        return GateOutcome.IN_FLIGHT
    if tier.max_in_flight and load.tier_in_flight.get(tier.name, 0) >= tier.max_in_flight:
        return GateOutcome.TIER_IN_FLIGHT
    if tier.max_backend_in_flight and load.in_flight >= tier.max_backend_in_flight:
        return GateOutcome.RESERVED  # the remaining slots are kept for higher tiers
    snap = load.snapshot
    if snap is None:
        return GateOutcome.NO_METRICS
    if now - snap.taken_at > stale_after:
        return GateOutcome.STALE
    # A threshold of 0 means "only while the backend queue is empty", i.e. waiting < 1.
    if estimated_waiting(load) >= max(tier.max_backend_waiting, 1):
        return GateOutcome.WAITING
    limit = tier.tpot_limit_seconds
    if limit is not None and snap.tpot_seconds is not None and snap.tpot_seconds > limit:
        return GateOutcome.TPOT
    kv_limit = tier.kv_usage_limit
    if kv_limit is not None and snap.kv_usage is not None and snap.kv_usage > kv_limit:
        return GateOutcome.KV_CACHE
    return GateOutcome.ADMIT
