"""A replica's limit book in a cluster: the Redis book on the replica's connection and state."""

from __future__ import annotations

from fairq_server.cluster.node import ClusterNode
from fairq_server.tenancy.books.cluster import ClusterBook
from fairq_server.tenancy.books.local import LocalBook
from fairq_server.tenancy.books.redis import RedisBook

__all__ = ["cluster_book"]


def cluster_book(node: ClusterNode) -> ClusterBook:
    """Return the book quotas and budgets are counted in across ``node``'s cluster.

    It shares the replica's Redis client and key prefix; while the replica is off Redis (its
    shared gate on the local share) it grants from a one-process book with each limit scaled
    by the same local share, and its Redis failures are the replica's (log, metrics, state).
    """
    shared = RedisBook(
        node.client,
        node.config.key_prefix,
        LocalBook(),
        share=lambda: node.local_share,
        available=lambda: node.reserving,
        lost=node.redis_lost,
        registry=node.metrics.registry,
    )
    # Settlements are the replica's background tasks: leaving the cluster waits for them
    # (bounded by a lease) before the connection closes.
    return ClusterBook(shared, node.spawn)
