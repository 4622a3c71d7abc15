"""The entitlement's Prometheus metrics: per-team use of each limit, refusals, the soft band.

Labels stay bounded: ``kind`` and ``mode`` are fixed words, ``model`` only ever a model named
by a configured entry, and ``team`` goes through
:class:`~fairq_server.tenancy.team_labels.TeamLabels` like every other per-team metric. User
limits are not exported per user (their number is the callers'); their refusals and warnings
are counted by kind.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from fairq_server.tenancy.team_labels import TeamLabels

__all__ = ["EntitlementMetrics"]

#: The labels of every per-team limit gauge: the team, the limit's kind, model and mode.
_TEAM_LIMIT_LABELS = ("team", "kind", "model", "mode")


def _team_gauge(registry: CollectorRegistry, name: str, documentation: str) -> Gauge:
    """Return a per-team limit gauge (labelled by :data:`_TEAM_LIMIT_LABELS`) on ``registry``."""
    return Gauge(name, documentation, _TEAM_LIMIT_LABELS, registry=registry)


class EntitlementMetrics:
    """The metric objects of the quotas and budgets, on the process's registry.

    Args:
        registry: where to register them.
        team_labels: the process's bounded team labels (shared with the other team metrics).

    """

    def __init__(self, registry: CollectorRegistry, team_labels: TeamLabels) -> None:
        self.team_labels = team_labels
        self.team_use = _team_gauge(
            registry,
            "fairq_team_limit_used_ratio",
            "Each team's use of its quota or budget in the current window, as a fraction of the "
            "limit (1 or more: reached).",
        )
        self.team_used = _team_gauge(
            registry,
            "fairq_team_limit_used",
            "Each team's use of its quota or budget in the current window (tokens, requests, "
            "or cost units).",
        )
        self.team_limit = _team_gauge(
            registry, "fairq_team_limit", "Each team's configured quota or budget per window."
        )
        self.refusals = Counter(
            "fairq_limit_refusals_total",
            "Requests refused by a hard quota or budget, by the limit's kind "
            "(tokens_per_minute, budget_per_day, ...) and scope (team or user).",
            ["kind", "scope"],
            registry=registry,
        )
        self.demotions = Counter(
            "fairq_soft_band_demotions_total",
            "Dispatches that passed over a request in the idle-only band (its user or team "
            "over a soft quota or budget) for an in-quota one.",
            registry=registry,
        )
        self.band_served = Counter(
            "fairq_soft_band_dispatches_total",
            "Requests dispatched from the idle-only band (no in-quota request of their tier "
            "waited for the model).",
            registry=registry,
        )
        self.warnings = Counter(
            "fairq_limit_warnings_total",
            "Quotas and budgets that reached 80 % of their limit, once per key and window.",
            ["kind", "scope"],
            registry=registry,
        )

    def clear_team_limits(self) -> None:
        """Forget every team's limit figures (the entries changed; the next tick sets them)."""
        for gauge in (self.team_use, self.team_used, self.team_limit):
            gauge.clear()

    def set_team_limit(self, labels: tuple[str, str, str, str], used: float, limit: float) -> None:
        """Show one team limit's use ``used`` of ``limit`` (labels: team, kind, model, mode)."""
        self.team_used.labels(*labels).set(used)
        self.team_limit.labels(*labels).set(limit)
        self.team_use.labels(*labels).set(used / limit)
