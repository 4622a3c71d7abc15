"""Name -> factory registries for the scheduling plugins.

Names are kebab-case. A factory takes the plugin's options as keyword arguments, from the
plugin's own options table in the configuration (``fairness_options``, ``ordering_options``,
``gate_options``, ``routing_options``). An unknown name, or an option the plugin does not take,
raises :class:`ValueError` naming the valid ones, so a typo in the configuration fails at
start-up. A fairness factory with a ``counters`` parameter is also given the tier's
:class:`~fairq_server.scheduling.interfaces.ServiceCounters` (never an option): that is how a
policy takes part in a cluster's fairness. A new policy is one module and one line here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fairq_server.scheduling.fairness import RoundRobinFairness, VtcFairness
from fairq_server.scheduling.gate import ThresholdGate
from fairq_server.scheduling.interfaces import (
    FairnessPolicy,
    Gate,
    OrderingPolicy,
    Router,
    ServiceCounters,
)
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

#: Factory parameters the registry supplies itself; no configuration option may set them.
_SUPPLIED = frozenset({"counters"})

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
    kind: str,
    registry: Mapping[str, Callable[..., T]],
    name: str,
    options: Mapping[str, Any],
    supplied: Mapping[str, Any] | None = None,
) -> T:
    try:
        factory = registry[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; valid: {', '.join(sorted(registry))}") from None
    parameters = set(inspect.signature(factory).parameters)
    accepted = parameters - _SUPPLIED
    unknown = sorted(set(options) - accepted)
    if unknown:
        valid = ", ".join(sorted(accepted)) or "none"
        raise ValueError(f"{kind} {name!r} takes no option {unknown[0]!r}; options: {valid}")
    given = {k: v for k, v in (supplied or {}).items() if k in parameters and v is not None}
    try:
        return factory(**options, **given)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{kind} {name!r}: {exc}") from None


def make_fairness(
    name: str, options: Mapping[str, Any] | None = None, counters: ServiceCounters | None = None
) -> FairnessPolicy:
    """Create the fairness policy registered as ``name``, keeping its state in ``counters``.

    ``counters`` go to a factory with a ``counters`` parameter (None: the policy keeps its
    own, on one process).
    """
    return _make("fairness policy", FAIRNESS_POLICIES, name, options or {}, {"counters": counters})


def make_ordering(name: str, options: Mapping[str, Any] | None = None) -> OrderingPolicy:
    """Create the ordering policy registered as ``name``."""
    return _make("ordering policy", ORDERING_POLICIES, name, options or {})


def make_gate(name: str, options: Mapping[str, Any] | None = None) -> Gate:
    """Create the gate registered as ``name``."""
    return _make("gate", GATES, name, options or {})


def make_router(name: str, options: Mapping[str, Any] | None = None) -> Router:
    """Create the router registered as ``name``."""
    return _make("router", ROUTERS, name, options or {})
