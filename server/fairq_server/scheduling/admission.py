"""Whether a submitted request may join its model's queue, and the error it gets if not.

The checks run in the dispatcher loop, in this order: fairq shutting down, the model not
served here, no healthy backend for it, all queues together full (``max_queued_total``), the
user's requests queued for any model at the cap (``max_queued_per_user``). Both caps count
every model's queue: a cap per model would let one user hold the per-user cap once per model.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from fairq_server.config.scheduler import SchedulerConfig
from fairq_server.errors import (
    ModelNotFoundError,
    NoBackendError,
    QueueFullError,
    SchedulerError,
    ShuttingDownError,
)
from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.queue import ModelQueue

__all__ = ["admission_error"]


def admission_error(
    model: str,
    user: str,
    backends: Sequence[BackendState],
    queue: ModelQueue | None,
    config: SchedulerConfig,
    *,
    closed: bool,
    queues: Collection[ModelQueue] = (),
) -> SchedulerError | None:
    """Return why a request of ``user`` for ``model`` cannot be queued (None: it can).

    Args:
        model: the model asked for.
        user: who asks.
        backends: the registered backends serving ``model``.
        queue: the model's queue (None: no backend ever served it).
        config: the scheduler's caps.
        closed: fairq is shutting down.
        queues: every model's queue (``queue`` among them), which the caps count.

    """
    if closed:
        return ShuttingDownError("fairq is shutting down")
    if not backends or queue is None:
        # Which models exist is told only to callers allowed to know (the servicer).
        return ModelNotFoundError(f"model '{model}' is not served here")
    if not any(b.serving for b in backends):
        return NoBackendError(f"no healthy backend serves model '{model}'")
    every = queues or (queue,)
    total = sum(len(q) for q in every)
    if total >= config.max_queued_total:
        return QueueFullError(
            f"fairq's queues are full ({total} requests queued, max_queued_total)"
        )
    if sum(q.user_len(user) for q in every) >= config.max_queued_per_user:
        return QueueFullError(
            f"user '{user}' already has {config.max_queued_per_user} queued requests "
            "(max_queued_per_user, over all models)"
        )
    return None
