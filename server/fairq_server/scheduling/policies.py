"""The plugins one configuration selects, built together so a typo fails at start-up.

Every plugin takes its options the same way: from its own table of ``[scheduler]``
(``fairness_options``, ``ordering_options``, ``gate_options``, ``routing_options``), checked by
its registry against the plugin's factory. ``routing_slack``, the one option that predates the
tables, is kept as an alias of ``routing_options.slack`` and logged as deprecated.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from fairq_server.config.scheduler import SchedulerConfig
from fairq_server.errors import ConfigError
from fairq_server.scheduling.counters import LocalCounters
from fairq_server.scheduling.fairness.hierarchy import TeamFairness
from fairq_server.scheduling.interfaces import (
    FairnessPolicy,
    Gate,
    OrderingPolicy,
    Router,
    ServiceCounters,
)
from fairq_server.scheduling.queue import ModelQueue
from fairq_server.scheduling.registry import make_fairness, make_gate, make_ordering, make_router

__all__ = ["Policies", "check_policies", "routing_options"]

log = logging.getLogger(__name__)


def routing_options(config: SchedulerConfig) -> dict[str, Any]:
    """Return the router's options: ``routing_options``, with the deprecated alias folded in.

    Raises:
        ValueError: ``routing_slack`` and ``routing_options.slack`` are both set.

    """
    options = dict(config.routing_options)
    if config.routing_slack is None:
        return options
    if "slack" in options:
        raise ValueError("routing_slack is an old name of routing_options.slack; set only one")
    if config.routing != "prefix-affinity":
        return options  # as before the tables: only prefix affinity ever took it
    log.warning("scheduler.routing_slack is deprecated; use scheduler.routing_options.slack")
    options["slack"] = config.routing_slack
    return options


def check_policies(config: SchedulerConfig) -> None:
    """Refuse a ``[scheduler]`` whose plugins cannot be built from their options tables.

    The configuration package knows the plugins' names only; their options are the plugins'
    own (each factory's parameters), so they are checked here, where the plugins are built:
    by ``fairq serve`` after reading the file and at every reload, and by the core.

    Raises:
        ConfigError: naming the options table, e.g. ``scheduler.fairness_options: fairness
            policy 'vtc' takes no option 'x'; options: lift, output_weight``.

    """
    Policies.from_config(config)


@contextlib.contextmanager
def _naming(key: str) -> Iterator[None]:
    try:
        yield
    except ValueError as exc:
        raise ConfigError(f"scheduler.{key}: {exc}") from None


@dataclass(frozen=True)
class Policies:
    """The plugins in use.

    Attributes:
        fairness: makes one tier's fairness policy, given the tier's service counters; a
            tier's queue applies it between teams and within each (see
            :mod:`fairq_server.scheduling.fairness.hierarchy`).
        ordering: orders one user's requests.
        gate: the saturation check.
        router: chooses among the backends whose gate is open.
        counters: makes one tier's service counters (a cluster shares them between
            replicas; see :mod:`fairq_server.scheduling.counters`).

    """

    fairness: Callable[[ServiceCounters], FairnessPolicy]
    ordering: OrderingPolicy
    gate: Gate
    router: Router
    counters: Callable[[], LocalCounters] = LocalCounters

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> Policies:
        """Build the plugins ``config`` names, each with its options table.

        Raises:
            ConfigError: an unknown plugin name, or an options table its plugin does not
                take; the message names the key (``scheduler.routing_options: ...``).

        """
        options: Mapping[str, Any] = dict(config.fairness_options)
        with _naming("fairness_options"):
            make_fairness(config.fairness, options)  # fail now, not at the first request
        with _naming("ordering_options"):
            ordering = make_ordering(config.ordering, config.ordering_options)
        with _naming("gate_options"):
            gate = make_gate(config.gate, config.gate_options)
        with _naming("routing_options"):
            router = make_router(config.routing, routing_options(config))
        return cls(
            fairness=lambda counters: make_fairness(config.fairness, options, counters),
            ordering=ordering,
            gate=gate,
            router=router,
        )

    def new_queue(self, num_tiers: int) -> ModelQueue:
        """Return an empty queue with these policies (the fairness policy, per team)."""
        level = self.fairness

        def hierarchical(counters: ServiceCounters) -> FairnessPolicy:
            return TeamFairness(level, counters)

        return ModelQueue(num_tiers, hierarchical, self.ordering, self.counters)
