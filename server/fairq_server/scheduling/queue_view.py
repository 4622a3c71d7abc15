"""One moment's view of the queues and backends, as plain values, for operators' snapshots.

Read by :meth:`~fairq_server.core.FairqCore.queue_view` synchronously on the event loop (so
the figures are of one moment): queue depths per tier, queued users, and each backend's view
with its gate's answer per tier.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["BackendView", "QueueView"]


@dataclass(frozen=True)
class BackendView:
    """A registered backend as registered, and its live state, as plain values.

    Attributes:
        id: the backend's id.
        kind: its kind (``vllm``, ``tgi``, ``openai``).
        base_url: where it is reached.
        models: the models it is registered for.
        priority_scheduling: whether tiers pass to its own priority field.
        fair_share_priority: whether fair standing passes to its priority field.
        max_in_flight: its slot cap (0: none).
        preempt: whether its requests may be preempted.
        settings: kind-specific registration settings (the ``openai`` kind's metric map).
        reason: why it is unhealthy or draining ("" when it is neither).
        healthy: its last scrape succeeded and is fresh by the gate's own measure.
        in_flight: requests fairq runs on it now.
        waiting: the engine's waiting requests at the last scrape.
        running: the engine's running requests at the last scrape.
        tpot_seconds: measured time per output token (0 before a measure).
        draining: whether it takes no new work.

    """

    id: str
    kind: str
    base_url: str
    models: tuple[str, ...]
    priority_scheduling: bool
    fair_share_priority: bool
    max_in_flight: int
    preempt: bool
    settings: Mapping[str, str]
    reason: str
    healthy: bool
    in_flight: int
    waiting: float
    running: float
    tpot_seconds: float
    draining: bool


@dataclass
class QueueView:
    """Queue depths and backend states, as plain values.

    Attributes:
        tiers: tier names, highest priority first.
        models: per model, queued requests per tier (in tier order).
        queued_users: per model, users with a queued request.
        user_queued: per user, queued requests over all models.
        backends: per backend, its view and gate state per tier.

    """

    tiers: tuple[str, ...]
    models: dict[str, list[int]] = field(default_factory=dict)
    queued_users: dict[str, int] = field(default_factory=dict)
    user_queued: dict[str, int] = field(default_factory=dict)
    backends: list[tuple[BackendView, list[str]]] = field(default_factory=list)
