"""Queued requests that can no longer be served: waited too long, or no backend serves them.

Called by the dispatcher's loop (the only writer of queues) once per pass; each ticket found
is abandoned through the attempt book with the error its caller sees.
"""

from __future__ import annotations

from collections.abc import Callable

from fairq_server.errors import NoBackendError, QueueTimeoutError
from fairq_server.scheduling.attempts import AttemptBook
from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.model_set import ModelSet

__all__ = ["expire_queued", "sweep_unserved"]


def expire_queued(models: ModelSet, attempts: AttemptBook, ttl: float | None, now: float) -> None:
    """Abandon every request queued longer than ``ttl`` seconds (None: no bound)."""
    for ticket in models.expire(None if ttl is None else now - ttl):
        error = QueueTimeoutError(f"request waited in the queue longer than {ttl:g} s")
        attempts.abandon(ticket, error)


def sweep_unserved(
    models: ModelSet,
    backends_of: Callable[[str], list[BackendState]],
    attempts: AttemptBook,
    grace: float,
    now: float,
) -> None:
    """Abandon the requests of models no healthy backend has served for ``grace`` seconds."""
    for model, tickets in models.sweep(now, grace, backends_of):
        error = NoBackendError(
            f"no healthy backend has served model '{model.name}' for {grace:g} s"
        )
        for ticket in tickets:
            attempts.abandon(ticket, error)
