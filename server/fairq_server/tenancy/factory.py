"""Assembling the quotas and budgets of a process: the one place the limit book is chosen.

It takes the configuration and the telemetry by what it reads of them (the protocols below),
so the entitlement imports neither the whole configuration nor the process's telemetry.
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client import CollectorRegistry

from fairq_server.tenancy.books.local import LocalBook
from fairq_server.tenancy.checker import Entitlement, SyncBook
from fairq_server.tenancy.limit_settings import LimitSettings
from fairq_server.tenancy.metrics import EntitlementMetrics
from fairq_server.tenancy.team_labels import TeamLabels

__all__ = ["MetricsHome", "build_entitlement"]


class MetricsHome(Protocol):
    """Where the entitlement registers its metrics, with the process's bounded team labels."""

    registry: CollectorRegistry
    team_labels: TeamLabels


def build_entitlement(
    config: LimitSettings, telemetry: MetricsHome, book: SyncBook | None = None
) -> Entitlement:
    """Return the process's quotas and budgets, configured, on ``book``.

    One process counts in its own memory (:class:`LocalBook`: exact; nothing shared), the
    default. A cluster's book, shared by the replicas so that a limit holds whatever their
    number, is the cluster launcher's (:func:`fairq_server.cluster.quota.cluster_book`), which
    the core passes as ``book`` where ``[cluster]`` is configured. The dispatcher calls the book
    from its synchronous loop, so it answers :class:`SyncBook`'s calls without waiting.
    """
    metrics = EntitlementMetrics(telemetry.registry, telemetry.team_labels)
    entitlement = Entitlement(book if book is not None else LocalBook(), metrics)
    entitlement.configure(config.quotas, config.budgets, config.prices)
    return entitlement
