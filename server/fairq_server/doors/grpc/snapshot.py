"""The queue snapshot behind ``Admin/GetQueueSnapshot`` and ``fairq top``.

Everything read from the scheduling core is read by the core's
:meth:`~fairq_server.port.CorePort.queue_view`, synchronously on the event loop (so the
figures are of one moment), into plain values; :func:`build_snapshot` turns those into the
response.
"""

from __future__ import annotations

from fairq.v1 import admin_pb2
from fairq_server.observe.recent import RecentService
from fairq_server.scheduling.queue_view import BackendView, QueueView

__all__ = [
    "DEFAULT_TOP_USERS",
    "KIND_VALUES",
    "MAX_TOP_USERS",
    "backend_status",
    "build_snapshot",
]

DEFAULT_TOP_USERS = 10
MAX_TOP_USERS = 1000

#: The kinds admin.proto names (BACKEND_KIND_VLLM -> "vllm"); the core refuses a kind it lacks.
KIND_VALUES = {
    name.removeprefix("BACKEND_KIND_").lower(): name
    for name, _ in admin_pb2.BackendKind.items()
    if name != "BACKEND_KIND_UNSPECIFIED"
}


def build_snapshot(
    view: QueueView, recent: RecentService, top_users: int, wall_time: float
) -> admin_pb2.GetQueueSnapshotResponse:
    """Build the response from ``view`` and the recent-service figures.

    Args:
        view: what the core's ``queue_view`` returned.
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
                status=backend_status(status),
                gates=[
                    admin_pb2.TierGate(tier=name, state=state)
                    for name, state in zip(view.tiers, gates, strict=True)
                ],
            )
            for status, gates in view.backends
        ],
        known_users=len(names),
    )


def backend_status(view: BackendView) -> admin_pb2.BackendStatus:
    """Return a backend's registration and live state as admin.proto reports them."""
    return admin_pb2.BackendStatus(
        backend=admin_pb2.Backend(
            id=view.id,
            kind=KIND_VALUES.get(view.kind, "BACKEND_KIND_UNSPECIFIED"),
            base_url=view.base_url,
            models=list(view.models),
            priority_scheduling=view.priority_scheduling,
            fair_share_priority=view.fair_share_priority,
            max_in_flight=view.max_in_flight,
            preempt=view.preempt,
            **view.settings,
        ),
        reason=view.reason,
        healthy=view.healthy,
        in_flight=view.in_flight,
        waiting=view.waiting,
        running=view.running,
        tpot_seconds=view.tpot_seconds,
        draining=view.draining,
    )
