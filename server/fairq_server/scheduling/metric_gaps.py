"""Figures the configuration relies on that a backend's ``/metrics`` does not give.

A tier's ``kv_usage_limit`` reads the backend's KV-cache usage and ``tpot_limit_seconds`` its
time per output token; a backend whose metrics lack the figure cannot be held by that limit,
and without a word the limit would silently do nothing (llama.cpp stopped exporting its KV
usage). A metric named in the backend's configuration (``running_metric``, a preset's names)
is relied on as such. Each gap is logged when it first shows (normally at the first scrape),
counted in ``fairq_backend_metric_missing{backend, metric}`` and given as the backend's
``reason`` in ``ListBackends``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fairq_server.backends.request import MetricsSample
from fairq_server.config.tiers import TierConfig

__all__ = ["Gap", "describe", "gaps", "relied_on"]

#: ``(figure, sample name)``: the name looked for, ``""`` when none is mapped.
Gap = tuple[str, str]

_READ_BY = {
    "running": "the running count",
    "kv_usage": "kv_usage_limit",
    "tpot": "tpot_limit_seconds",
}


def relied_on(tiers: Iterable[TierConfig]) -> frozenset[str]:
    """Return the figures some tier's limits read."""
    figures = set()
    for tier in tiers:
        if tier.kv_usage_limit is not None:
            figures.add("kv_usage")
        if tier.tpot_limit_seconds is not None:
            figures.add("tpot")
    return frozenset(figures)


def gaps(sample: MetricsSample, relied: frozenset[str]) -> tuple[Gap, ...]:
    """Return the figures of ``sample`` that are missing and relied on.

    A figure is relied on when a tier's limit reads it, or when the configuration names the
    metric it comes from (then the name itself is missing).
    """
    return tuple((f, name) for f, name in sample.missing if f in relied or name)


def describe(found: Sequence[Gap]) -> str:
    """Return the sentence for ``found`` (the log line and the ``ListBackends`` reason)."""
    parts = [
        f"{name or 'no ' + figure.replace('_', ' ') + ' metric'} "
        f"(read by {_READ_BY.get(figure, figure)})"
        for figure, name in found
    ]
    return (
        f"its /metrics lacks {', '.join(parts)}: what reads them does nothing on this backend; "
        "map the metric (kv_usage_metric, tpot_metric, running_metric) or drop the limit"
    )
