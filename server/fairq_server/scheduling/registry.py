"""Name -> factory registries for the scheduling plugins.

Names are kebab-case. A factory takes the plugin's options as keyword arguments (from the
configuration). An unknown name, or an option the plugin does not take, raises
:class:`ValueError` naming the valid ones, so a typo in the configuration fails at start-up.
A new policy is one module and one line here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fairq_server.scheduling.fairness import RoundRobinFairness, VtcFairness
from fairq_server.scheduling.gate import ThresholdGate
from fairq_server.scheduling.interfaces import FairnessPolicy, Gate, OrderingPolicy, Router
from fairq_server.scheduling.ordering import FifoOrdering, ShortestFirstOrdering
from fairq_server.scheduling.routing import LeastLoadedRouter, PrefixAffinityRouter

__all__ = [
    "FAIRNESS_POLICIES",
    "GATES",
    "ORDERING_POLICIES",
    "ROUTERS",
    "make_fairness",
    "make_gate",
    "make_ordering",
    "make_router",
]

T = TypeVar("T")

FAIRNESS_POLICIES: Mapping[str, Callable[..., FairnessPolicy]] = {
    "round-robin": RoundRobinFairness,
    "vtc": VtcFairness,
}

ORDERING_POLICIES: Mapping[str, Callable[..., OrderingPolicy]] = {
    "fifo": FifoOrdering,
    "shortest-first": ShortestFirstOrdering,
}

GATES: Mapping[str, Callable[..., Gate]] = {
    "threshold": ThresholdGate,
}

ROUTERS: Mapping[str, Callable[..., Router]] = {
    "prefix-affinity": PrefixAffinityRouter,
    "least-loaded": LeastLoadedRouter,
}


def _make(
    kind: str, registry: Mapping[str, Callable[..., T]], name: str, options: Mapping[str, Any]
) -> T:
    try:
        factory = registry[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; valid: {', '.join(sorted(registry))}") from None
    accepted = set(inspect.signature(factory).parameters)
    unknown = sorted(set(options) - accepted)
    if unknown:
        valid = ", ".join(sorted(accepted)) or "none"
        raise ValueError(f"{kind} {name!r} takes no option {unknown[0]!r}; options: {valid}")
    try:
        return factory(**options)
    except TypeError as exc:
        raise ValueError(f"{kind} {name!r}: {exc}") from None


def make_fairness(name: str, options: Mapping[str, Any] | None = None) -> FairnessPolicy:
    """Create the fairness policy registered as ``name``."""
    return _make("fairness policy", FAIRNESS_POLICIES, name, options or {})


def make_ordering(name: str, options: Mapping[str, Any] | None = None) -> OrderingPolicy:
    """Create the ordering policy registered as ``name``."""
    return _make("ordering policy", ORDERING_POLICIES, name, options or {})


def make_gate(name: str, options: Mapping[str, Any] | None = None) -> Gate:
    """Create the gate registered as ``name``."""
    return _make("gate", GATES, name, options or {})


def make_router(name: str, options: Mapping[str, Any] | None = None) -> Router:
    """Create the router registered as ``name``."""
    return _make("router", ROUTERS, name, options or {})
