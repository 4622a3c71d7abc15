"""The errors fairq raises, and the one table that maps them to gRPC status codes.

Exception tree::

    SchedulerError                  a request could not be served
    ├── RejectedError               refused before it was queued
    │   ├── InvalidRequestError     INVALID_ARGUMENT: malformed or out-of-range input
    │   ├── UnauthenticatedError    UNAUTHENTICATED: missing or unknown API key
    │   ├── PermissionDeniedError   PERMISSION_DENIED: tier above the key's ceiling, non-admin
    │   ├── ModelNotFoundError      NOT_FOUND: no backend serves the model
    │   ├── QueueFullError          RESOURCE_EXHAUSTED: a queue cap was reached
    │   └── NoBackendError          UNAVAILABLE: no healthy backend for the model
    └── EvictedError                ended after it was queued
        ├── QueueTimeoutError       DEADLINE_EXCEEDED: waited longer than the queue TTL
        ├── ShuttingDownError       UNAVAILABLE: the server is stopping
        ├── SlowClientError         RESOURCE_EXHAUSTED: the caller left too much text unread
        ├── InternalError           INTERNAL: a fault inside fairq (logged with its traceback)
        └── BackendFailedError      the backend failed; code chosen from its failure kind

Backend adapters raise :class:`~fairq_server.backends.errors.BackendError`, which knows nothing
of gRPC; the dispatcher wraps it in :class:`BackendFailedError` when it gives up on a request,
and :func:`status_for` maps its kind here, in the same table as everything else.

Anything else that escapes a servicer becomes ``INTERNAL``. ``asyncio.CancelledError`` is never
caught here: a cancelled client is not an error to report.
"""

from __future__ import annotations

import grpc

from fairq_server.backends.errors import BackendError, BackendFailure

__all__ = [
    "BackendFailedError",
    "EvictedError",
    "InternalError",
    "InvalidRequestError",
    "ModelNotFoundError",
    "NoBackendError",
    "PermissionDeniedError",
    "QueueFullError",
    "QueueTimeoutError",
    "RejectedError",
    "SchedulerError",
    "ShuttingDownError",
    "SlowClientError",
    "UnauthenticatedError",
    "status_for",
]


class SchedulerError(Exception):
    """Base class of every error fairq reports to a caller."""


class RejectedError(SchedulerError):
    """The request was refused before it entered a queue."""


class InvalidRequestError(RejectedError):
    """The request is malformed or a value is out of range."""


class UnauthenticatedError(RejectedError):
    """No valid API key was presented."""


class PermissionDeniedError(RejectedError):
    """The principal may not do this (tier ceiling, admin-only call)."""


class ModelNotFoundError(RejectedError):
    """No registered backend serves the requested model."""


class QueueFullError(RejectedError):
    """A per-user or global queue cap was reached."""


class NoBackendError(RejectedError):
    """Every backend of the model is unhealthy."""


class EvictedError(SchedulerError):
    """The request was queued or running and then ended without finishing."""


class QueueTimeoutError(EvictedError):
    """The request waited in the queue longer than allowed."""


class ShuttingDownError(EvictedError):
    """The server stopped before the request could run."""


class SlowClientError(EvictedError):
    """The caller left more generated text unread than fairq holds for it."""


class InternalError(EvictedError):
    """A fault inside fairq ended the request; the details are in fairq's log only."""

    def __init__(self, message: str = "internal error") -> None:
        super().__init__(message)


class BackendFailedError(EvictedError):
    """The backend refused or failed the request.

    Attributes:
        cause: the backend's error, in the backend's terms.

    """

    def __init__(self, cause: BackendError) -> None:
        super().__init__(str(cause))
        self.cause = cause


_BACKEND_STATUS: dict[BackendFailure, grpc.StatusCode] = {
    BackendFailure.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    BackendFailure.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    BackendFailure.INVALID_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    BackendFailure.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    BackendFailure.FAILED: grpc.StatusCode.INTERNAL,
}

_STATUS: dict[type[SchedulerError], grpc.StatusCode] = {
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    UnauthenticatedError: grpc.StatusCode.UNAUTHENTICATED,
    PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    ModelNotFoundError: grpc.StatusCode.NOT_FOUND,
    QueueFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    NoBackendError: grpc.StatusCode.UNAVAILABLE,
    QueueTimeoutError: grpc.StatusCode.DEADLINE_EXCEEDED,
    ShuttingDownError: grpc.StatusCode.UNAVAILABLE,
    SlowClientError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    InternalError: grpc.StatusCode.INTERNAL,
}


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """Return the gRPC status code and message a caller should see for ``exc``."""
    if isinstance(exc, BackendFailedError | BackendError):
        cause = exc.cause if isinstance(exc, BackendFailedError) else exc
        return _BACKEND_STATUS[cause.kind], str(cause)
    for cls in type(exc).__mro__:
        code = _STATUS.get(cls)
        if code is not None:
            return code, str(exc)
    return grpc.StatusCode.INTERNAL, "internal error"
