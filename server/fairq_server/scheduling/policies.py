"""The plugins one configuration selects, built together so a typo fails at start-up."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fairq_server.config import SchedulerConfig
from fairq_server.scheduling.interfaces import FairnessPolicy, Gate, OrderingPolicy, Router
from fairq_server.scheduling.queue import ModelQueue
from fairq_server.scheduling.registry import make_fairness, make_gate, make_ordering, make_router

__all__ = ["Policies"]


@dataclass(frozen=True)
class Policies:
    """Fairness (a factory: one policy per tier queue), ordering, gate and router."""

    fairness: Callable[[], FairnessPolicy]
    ordering: OrderingPolicy
    gate: Gate
    router: Router

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> Policies:
        """Build the plugins ``config`` names.

        Raises:
            ValueError: an unknown plugin name or option.

        """
        options = dict(config.fairness_options)
        make_fairness(config.fairness, options)  # fail now, not at the first request
        routing = {"slack": config.routing_slack} if config.routing == "prefix-affinity" else {}
        return cls(
            fairness=lambda: make_fairness(config.fairness, options),
            ordering=make_ordering(config.ordering),
            gate=make_gate(config.gate),
            router=make_router(config.routing, routing),
        )

    def new_queue(self, num_tiers: int) -> ModelQueue:
        """Return an empty queue with these policies."""
        return ModelQueue(num_tiers, self.fairness, self.ordering)
