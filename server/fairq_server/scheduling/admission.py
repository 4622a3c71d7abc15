"""Whether a submitted request may join its model's queue, and the error it gets if not.

The checks run in the dispatcher loop, in this order: fairq shutting down, the model not
served here, no healthy backend for it, the model's queue full, the user's share of it full.
"""

from __future__ import annotations

from collections.abc import Sequence

from fairq_server.config import SchedulerConfig
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
) -> SchedulerError | None:
    """Return why a request of ``user`` for ``model`` cannot be queued (None: it can).

    Args:
        model: the model asked for.
        user: who asks.
        backends: the registered backends serving ``model``.
        queue: the model's queue (None: no backend ever served it).
        config: the scheduler's caps.
        closed: fairq is shutting down.

    """
    if closed:
        return ShuttingDownError("fairq is shutting down")
    if not backends or queue is None:
        # Which models exist is told only to callers allowed to know (the servicer).
        return ModelNotFoundError(f"model '{model}' is not served here")
    if not any(b.serving for b in backends):
        return NoBackendError(f"no healthy backend serves model '{model}'")
    if len(queue) >= config.max_queued_total:
        return QueueFullError(f"queue for model '{model}' is full ({len(queue)} requests)")
    if queue.user_len(user) >= config.max_queued_per_user:
        return QueueFullError(
            f"user '{user}' already has {config.max_queued_per_user} queued requests"
        )
    return None
