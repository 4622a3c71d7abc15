"""Backpressure: whether a backend may take one more request of a given tier right now.

:class:`ThresholdGate` is a pure function of the backend's state. fairq knows its own share of
the backend's queue better than any scrape: a request it sent that has not produced a token
yet is waiting (or travelling there, or in prefill), and one that has is running. So the
estimate is fairq's own tokenless requests, counted live, plus the waiting requests of *other*
clients as of the last scrape (the scraped count minus fairq's tokenless requests when the
scrape was sent). A slot freed by a finishing request is refilled as soon as the backend
starts the next one (its first token), not at the next scrape, so the poll interval does not
pace dispatch. Missing or stale metrics count as saturated (fail closed).

In a cluster the other replicas' requests count as fairq's own (``peer_awaiting``,
``peer_in_flight``, read from the shared gate in Redis), and while Redis is unreachable each
replica uses only its ``share`` of the thresholds and caps. On one process both are neutral.
"""

from __future__ import annotations

import math

from fairq_server.config.tiers import TierConfig
from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.interfaces import GateOutcome

__all__ = ["GateOutcome", "ThresholdGate", "estimated_waiting"]


def estimated_waiting(backend: BackendState) -> float:
    """Other clients' waiting requests at the last scrape + fairq's own tokenless ones now.

    fairq's own: this replica's and, in a cluster, the other replicas' (as last read).
    """
    sample = backend.sample
    if sample is None:
        return float("inf")
    # Clamped: a request of ours that got its first token between the scrape being sent and
    # the backend answering it is in the mark but no longer in the scraped count.
    others = max(0.0, sample.waiting - backend.awaiting_mark)
    return others + backend.awaiting_first_token + backend.peer_awaiting


def _scaled(limit: int, share: float) -> int:
    """Return a replica's part of ``limit`` (at least 1: every replica makes progress)."""
    return limit if share >= 1 else max(1, math.floor(limit * share))


class ThresholdGate:
    """Admit while the estimated backend queue is below the tier's threshold.

    Also refuses on the backend's and the tier's in-flight caps, on time per output token
    above the tier's limit, and on KV-cache usage above the tier's limit.
    """

    def check(
        self, backend: BackendState, tier: TierConfig, now: float, stale_after: float
    ) -> GateOutcome:
        """See :meth:`fairq_server.scheduling.interfaces.Gate.check`."""
        if backend.draining:
            return GateOutcome.DRAINING
        if backend.healthy is False:  # suspect or down
            return GateOutcome.UNHEALTHY
        share = backend.share
        in_flight = backend.in_flight + backend.peer_in_flight
        # A slot about to free counts as free: its successor waits a step in the engine's
        # queue instead of the slot waiting for fairq (lookahead).
        running = in_flight - backend.finishing
        if backend.max_in_flight and running >= _scaled(backend.max_in_flight, share):
            return GateOutcome.IN_FLIGHT
        if tier.max_in_flight and backend.tier_in_flight.get(tier.name, 0) >= tier.max_in_flight:
            return GateOutcome.TIER_IN_FLIGHT
        if tier.max_backend_in_flight and in_flight >= _scaled(tier.max_backend_in_flight, share):
            return GateOutcome.RESERVED  # the remaining slots are kept for higher tiers
        sample = backend.sample
        if sample is None:
            return GateOutcome.NO_METRICS
        if now - backend.sampled_at > stale_after:
            return GateOutcome.STALE
        # A threshold of 0 means "only while the backend queue is empty", i.e. waiting < 1.
        if estimated_waiting(backend) >= _scaled(max(tier.max_backend_waiting, 1), share):
            return GateOutcome.WAITING
        tpot, limit = backend.tpot_seconds, tier.tpot_limit_seconds
        if limit is not None and tpot is not None and tpot > limit:
            return GateOutcome.TPOT
        kv_limit = tier.kv_usage_limit
        if kv_limit is not None and sample.kv_usage is not None and sample.kv_usage > kv_limit:
            return GateOutcome.KV_CACHE
        return GateOutcome.ADMIT
