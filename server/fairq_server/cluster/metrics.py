"""Metrics of a replica in a cluster: its view of Redis, the shared gate and its peers."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["ClusterMetrics"]


class ClusterMetrics:
    """Registered on the replica's own registry (its ``/metrics``), only with ``[cluster]``.

    ``fairq_cluster_global_*`` are the cluster-wide counts as this replica last read them;
    every replica reports the same values, so take one replica's (or ``max``), not a sum.
    """

    def __init__(self, registry: CollectorRegistry, replica: str) -> None:
        r = self.registry = registry
        self.info = Gauge(
            "fairq_cluster_replica", "1, labelled with this replica's id.", ["replica"], registry=r
        )
        self.info.labels(replica).set(1)
        self.redis_up = Gauge(
            "fairq_cluster_redis_up",
            "1 while Redis answers; 0 while this replica runs on its local share.",
            registry=r,
        )
        self.redis_state = Gauge(
            "fairq_cluster_redis_state",
            "1 for the state Redis is in for this replica: up, unreachable, or "
            "credentials_refused (a wrong or missing password: a configuration error).",
            ["state"], registry=r,
        )  # fmt: skip
        self.replicas = Gauge(
            "fairq_cluster_replicas", "Replicas alive in the cluster, as last read.", registry=r
        )
        self.reservations = Counter(
            "fairq_cluster_reservations_total",
            "Shared-gate reservations by outcome (granted, handed, refused, unreachable, local, "
            "credit: sent on this replica's idle credit, no round trip).",
            ["backend", "outcome"], registry=r,
        )  # fmt: skip
        self.credit = Counter(
            "fairq_cluster_credit_total",
            "Idle shared-gate slots of this replica's credit: claimed, refused (no room), "
            "spent by a request (sent with no round trip), returned (backend full, Redis lost).",
            ["backend", "event"], registry=r,
        )  # fmt: skip
        self.reserve_seconds = Histogram(
            "fairq_cluster_reserve_seconds",
            "Round trip of one shared-gate reservation (time added before forwarding).",
            buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )
        self.global_awaiting = Gauge(
            "fairq_cluster_global_awaiting_first_token",
            "Every replica's requests on a backend without a token yet (shared gate).",
            ["backend"], registry=r,
        )  # fmt: skip
        self.global_in_flight = Gauge(
            "fairq_cluster_global_in_flight",
            "Every replica's requests running on a backend (shared gate).",
            ["backend"], registry=r,
        )  # fmt: skip
        self.redis_errors = Counter(
            "fairq_cluster_redis_errors_total", "Redis operations that failed.", registry=r
        )
