"""The queue snapshot behind ``Admin/GetQueueSnapshot`` and ``fairq top``.

Everything read from the scheduling core is read in :func:`read_core`, synchronously on the
event loop (so the figures are of one moment), into plain values; :func:`build_snapshot` turns
those into the response. A change in how the core keeps its queues or backend state is met in
:func:`read_core` alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fairq.v1 import admin_pb2
from fairq_server.core import FairqCore
from fairq_server.observe.recent import RecentService
from fairq_server.scheduling.backend_state import BackendState

__all__ = [
    "DEFAULT_TOP_USERS",
    "MAX_TOP_USERS",
    "CoreView",
    "build_snapshot",
    "read_core",
]

DEFAULT_TOP_USERS = 10
MAX_TOP_USERS = 1000

# How the Admin service reports a backend: (state, stale_after, now) -> BackendStatus.
StatusOf = Callable[[BackendState, float, float], admin_pb2.BackendStatus]


@dataclass
class CoreView:
    """What the snapshot needs from the core, as plain values.

    Attributes:
        tiers: tier names, highest priority first.
        models: per model, queued requests per tier (in tier order).
        queued_users: per model, users with a queued request.
        user_queued: per user, queued requests over all models.
        backends: per backend, its ``BackendStatus`` and gate state per tier.

    """

    tiers: tuple[str, ...]
    models: dict[str, list[int]] = field(default_factory=dict)
    queued_users: dict[str, int] = field(default_factory=dict)
    user_queued: dict[str, int] = field(default_factory=dict)
    backends: list[tuple[admin_pb2.BackendStatus, list[str]]] = field(default_factory=list)


def read_core(core: FairqCore, status_of: StatusOf) -> CoreView:
    """Read queue depths, queued users, and backend load and gate state from ``core``.

    Args:
        core: the scheduling core (read only, on the event loop).
        status_of: how a backend's ``BackendStatus`` is built (the Admin service's own).

    """
    config = core.config
    now = time.monotonic()
    stale_after = config.scheduler.stale_after_seconds
    view = CoreView(tiers=tuple(t.name for t in config.tiers))
    for model in sorted(core.dispatcher.model_states(), key=lambda m: m.name):
        queue = model.queue
        view.models[model.name] = [len(tier) for tier in queue.tiers]
        users: set[str] = set()
        for tier in queue.tiers:
            users.update(tier.users())
        view.queued_users[model.name] = len(users)
        for user in users:
            view.user_queued[user] = view.user_queued.get(user, 0) + queue.user_len(user)
    gate = core.policies.gate
    for backend in sorted(core.backends(), key=lambda b: b.backend.id):
        # The gate is a pure check: asking it here changes nothing, and counts no refusal.
        gates = [gate.check(backend, tier, now, stale_after).value for tier in config.tiers]
        view.backends.append((status_of(backend, stale_after, now), gates))
    return view


def build_snapshot(
    view: CoreView, recent: RecentService, top_users: int, wall_time: float
) -> admin_pb2.GetQueueSnapshotResponse:
    """Build the response from ``view`` and the recent-service figures.

    Args:
        view: what :func:`read_core` returned.
        recent: tokens served per user.
        top_users: how many users to list (0: :data:`DEFAULT_TOP_USERS`; capped at
            :data:`MAX_TOP_USERS`).
        wall_time: Unix time of the snapshot.

    """
    limit = min(top_users or DEFAULT_TOP_USERS, MAX_TOP_USERS)
    served = recent.values()
    names = set(view.user_queued) | set(served)
    ranked = sorted(names, key=lambda u: (-view.user_queued.get(u, 0), -served.get(u, 0.0), u))[
        :limit
    ]
    return admin_pb2.GetQueueSnapshotResponse(
        taken_at_unix_seconds=wall_time,
        models=[
            admin_pb2.ModelQueue(
                model=model,
                queued=sum(depths),
                tiers=[
                    admin_pb2.TierDepth(tier=name, queued=n)
                    for name, n in zip(view.tiers, depths, strict=True)
                ],
                queued_users=view.queued_users.get(model, 0),
            )
            for model, depths in view.models.items()
        ],
        users=[
            admin_pb2.UserLoad(
                user=u, queued=view.user_queued.get(u, 0), recent_tokens=served.get(u, 0.0)
            )
            for u in ranked
        ],
        backends=[
            admin_pb2.BackendLoad(
                status=status,
                gates=[
                    admin_pb2.TierGate(tier=name, state=state)
                    for name, state in zip(view.tiers, gates, strict=True)
                ],
            )
            for status, gates in view.backends
        ],
        known_users=len(names),
    )
