"""Fairness between users inside one tier: one policy per module, named in the registry."""

from fairq_server.scheduling.fairness.counter import CounterFairness
from fairq_server.scheduling.fairness.round_robin import RoundRobinFairness
from fairq_server.scheduling.fairness.vtc import VtcFairness

__all__ = ["CounterFairness", "RoundRobinFairness", "VtcFairness"]
