"""Name -> factory registries for the scheduling plugins.

Names are kebab-case. An unknown name raises :class:`ValueError` listing the valid ones, so a
typo in the configuration fails at start-up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from fairq_server.scheduling.fairness import RoundRobinFairness, VtcFairness
from fairq_server.scheduling.interfaces import FairnessPolicy, OrderingPolicy
from fairq_server.scheduling.ordering import FifoOrdering, ShortestFirstOrdering

__all__ = ["FAIRNESS_POLICIES", "ORDERING_POLICIES", "make_fairness", "make_ordering"]

T = TypeVar("T")

FAIRNESS_POLICIES: Mapping[str, Callable[[], FairnessPolicy]] = {
    "round-robin": RoundRobinFairness,
    "vtc": VtcFairness,
}

ORDERING_POLICIES: Mapping[str, Callable[[], OrderingPolicy]] = {
    "fifo": FifoOrdering,
    "shortest-first": ShortestFirstOrdering,
}


def _make(kind: str, registry: Mapping[str, Callable[[], T]], name: str) -> T:
    try:
        factory = registry[name]
    except KeyError:
        raise ValueError(
            f"unknown {kind} policy {name!r}; valid: {', '.join(sorted(registry))}"
        ) from None
    return factory()


def make_fairness(name: str) -> FairnessPolicy:
    """Create the fairness policy registered as ``name``."""
    return _make("fairness", FAIRNESS_POLICIES, name)


def make_ordering(name: str) -> OrderingPolicy:
    """Create the ordering policy registered as ``name``."""
    return _make("ordering", ORDERING_POLICIES, name)
