"""The queue snapshot of ``Admin/GetQueueSnapshot``, as plain dataclasses."""

from __future__ import annotations

from dataclasses import dataclass

from fairq._backends import BackendStatus, backend_status_from_proto
from fairq._messages import from_message
from fairq.v1 import admin_pb2

__all__ = ["BackendLoad", "ModelQueue", "Snapshot", "UserLoad"]


@dataclass(frozen=True, slots=True)
class ModelQueue:
    """The queue of one model.

    Attributes:
        model: The model name.
        queued: Requests waiting in fairq's queue, over all tiers.
        tiers: ``(tier, queued)`` pairs in tier order, highest priority first.
        queued_users: Users with at least one queued request.

    """

    model: str
    queued: int
    tiers: tuple[tuple[str, int], ...]
    queued_users: int


@dataclass(frozen=True, slots=True)
class UserLoad:
    """One user's queued requests and recent service.

    Attributes:
        user: The user name.
        queued: Requests queued over all models.
        recent_tokens: Tokens served, decayed with a 60 s time constant (about
            the last minute's tokens).

    """

    user: str
    queued: int
    recent_tokens: float


@dataclass(frozen=True, slots=True)
class BackendLoad:
    """A backend's live state and what its gate says per tier.

    Attributes:
        status: Registration and live state, as ``list_backends`` reports it.
        gates: ``(tier, state)`` pairs in tier order; ``state`` is ``"admit"`` or
            the reason the gate refuses (``"waiting"``, ``"tpot"``, ...).

    """

    status: BackendStatus
    gates: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """fairq's queues and backends at one moment.

    Attributes:
        taken_at: Unix time of the snapshot.
        models: One entry per model.
        users: The top users, by queued requests then recent tokens.
        backends: One entry per registered backend.
        known_users: Users with queued requests or recent service (``users``
            lists at most the number asked for).

    """

    taken_at: float
    models: tuple[ModelQueue, ...]
    users: tuple[UserLoad, ...]
    backends: tuple[BackendLoad, ...]
    known_users: int


def snapshot_from_proto(response: admin_pb2.GetQueueSnapshotResponse) -> Snapshot:
    """Convert a ``fairq.v1.GetQueueSnapshotResponse`` message."""
    models = tuple(
        from_message(ModelQueue, m, tiers=tuple((t.tier, t.queued) for t in m.tiers))
        for m in response.models
    )
    backends = tuple(
        BackendLoad(
            status=backend_status_from_proto(b.status),
            gates=tuple((g.tier, g.state) for g in b.gates),
        )
        for b in response.backends
    )
    return Snapshot(
        taken_at=response.taken_at_unix_seconds,
        models=models,
        users=tuple(from_message(UserLoad, u) for u in response.users),
        backends=backends,
        known_users=response.known_users,
    )
