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
        └── BackendError            the backend failed; code chosen from its answer

Anything else that escapes a servicer becomes ``INTERNAL``. ``asyncio.CancelledError`` is never
caught here: a cancelled client is not an error to report.
"""

from __future__ import annotations

import grpc

__all__ = [
    "BackendError",
    "EvictedError",
    "InvalidRequestError",
    "ModelNotFoundError",
    "NoBackendError",
    "PermissionDeniedError",
    "QueueFullError",
    "QueueTimeoutError",
    "RejectedError",
    "SchedulerError",
    "ShuttingDownError",
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


class BackendError(EvictedError):
    """The backend refused or failed the request.

    Attributes:
        code: the gRPC status the caller should see.
        retryable: True when the failure says nothing about the request itself (connection
            refused, reset, 5xx), so another backend may succeed.

    """

    def __init__(self, message: str, code: grpc.StatusCode, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


_STATUS: dict[type[SchedulerError], grpc.StatusCode] = {
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    UnauthenticatedError: grpc.StatusCode.UNAUTHENTICATED,
    PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    ModelNotFoundError: grpc.StatusCode.NOT_FOUND,
    QueueFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    NoBackendError: grpc.StatusCode.UNAVAILABLE,
    QueueTimeoutError: grpc.StatusCode.DEADLINE_EXCEEDED,
    ShuttingDownError: grpc.StatusCode.UNAVAILABLE,
}


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """Return the gRPC status code and message a caller should see for ``exc``."""
    if isinstance(exc, BackendError):
        return exc.code, str(exc)
    for cls in type(exc).__mro__:
        code = _STATUS.get(cls)
        if code is not None:
            return code, str(exc)
    return grpc.StatusCode.INTERNAL, "internal error"
