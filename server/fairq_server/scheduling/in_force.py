"""What the dispatcher runs with now: its tiers, scheduler settings and plugins.

One frozen value, replaced whole by the dispatcher when it applies a reload
(:class:`~fairq_server.scheduling.events.Reconfigure`), so a reader never sees the tiers of
one configuration with the plugins of another. The dispatcher's helpers (the dispatch pass,
the attempt book, the cluster's launcher) are given a function returning the current value:
they read it, and only the dispatcher writes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from fairq_server.config.scheduler import SchedulerConfig
from fairq_server.config.tiers import TierConfig
from fairq_server.scheduling.policies import Policies

__all__ = ["Settings"]


@dataclass(frozen=True)
class Settings:
    """Tiers (strict order), scheduler settings and the plugins they select."""

    tiers: tuple[TierConfig, ...]
    config: SchedulerConfig
    policies: Policies
