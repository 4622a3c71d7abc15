"""Assembling the quotas and budgets of a process: the one place the limit book is chosen."""

from __future__ import annotations

from fairq_server.config import Config
from fairq_server.entitlement.checker import Entitlement, SyncBook
from fairq_server.entitlement.local_book import LocalBook
from fairq_server.entitlement.metrics import EntitlementMetrics
from fairq_server.telemetry import Telemetry

__all__ = ["build_entitlement", "limit_book"]


def limit_book(config: Config) -> SyncBook:
    """Return the book that counts quotas and budgets for ``config``.

    One process counts in its own memory (exact; nothing shared). A cluster's book, shared by
    the replicas so that a limit holds whatever their number, is the cluster launcher's
    (:func:`fairq_server.cluster.quota.cluster_book`), which the core passes as
    :func:`build_entitlement`'s ``book`` where ``[cluster]`` is configured. The dispatcher
    calls the book from its synchronous loop, so whatever is returned answers
    :class:`SyncBook`'s calls without waiting.
    """
    return LocalBook()


def build_entitlement(
    config: Config, telemetry: Telemetry, book: SyncBook | None = None
) -> Entitlement:
    """Return the process's quotas and budgets, configured, on ``book`` (default: chosen)."""
    metrics = EntitlementMetrics(telemetry.registry, telemetry.team_labels)
    entitlement = Entitlement(book if book is not None else limit_book(config), metrics)
    entitlement.configure(config.quotas, config.budgets, config.prices)
    return entitlement
