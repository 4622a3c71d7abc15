"""The gRPC door's one table from fairq's errors to gRPC status codes.

=========================  ====================  ==============================================
error                      status                message
=========================  ====================  ==============================================
InvalidRequestError        INVALID_ARGUMENT      the error's
UnauthenticatedError       UNAUTHENTICATED       the error's
PermissionDeniedError      PERMISSION_DENIED     the error's
ModelNotFoundError         NOT_FOUND             the error's
QueueFullError             RESOURCE_EXHAUSTED    the error's
QuotaExceededError         RESOURCE_EXHAUSTED    the error's; ``grpc-retry-pushback-ms`` trailer
NoBackendError             UNAVAILABLE           the error's
QueueTimeoutError          DEADLINE_EXCEEDED     the error's
ShuttingDownError          UNAVAILABLE           the error's
SlowClientError            RESOURCE_EXHAUSTED    the error's
InternalError              INTERNAL              the error's ("internal error" by default)
BackendFailedError         by the failure kind   the backend's (see ``_BACKEND_STATUS``)
anything else              INTERNAL              "internal error" (nothing of the exception)
=========================  ====================  ==============================================

Only exceptions are mapped: ``asyncio.CancelledError`` (a ``BaseException``) is never caught
by the servicers, since a cancelled call is not an error to report.
"""

from __future__ import annotations

import math

import grpc

from fairq_server.errors import (
    BackendFailure,
    InternalError,
    InvalidRequestError,
    ModelNotFoundError,
    NoBackendError,
    PermissionDeniedError,
    QueueFullError,
    QueueTimeoutError,
    QuotaExceededError,
    SchedulerError,
    ShuttingDownError,
    SlowClientError,
    UnauthenticatedError,
    door_entry,
)

__all__ = ["RETRY_PUSHBACK", "status_for", "trailers_for"]

#: gRPC's own trailing-metadata key for "retry after this many milliseconds".
RETRY_PUSHBACK = "grpc-retry-pushback-ms"

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
    QuotaExceededError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    NoBackendError: grpc.StatusCode.UNAVAILABLE,
    QueueTimeoutError: grpc.StatusCode.DEADLINE_EXCEEDED,
    ShuttingDownError: grpc.StatusCode.UNAVAILABLE,
    SlowClientError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    InternalError: grpc.StatusCode.INTERNAL,
}


def status_for(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """Return the gRPC status code and message a caller should see for ``exc``."""
    found = door_entry(exc, _STATUS, _BACKEND_STATUS)
    return found if found is not None else (grpc.StatusCode.INTERNAL, "internal error")


def trailers_for(exc: Exception) -> tuple[tuple[str, str], ...]:
    """Return the trailing metadata that goes with ``exc``'s status (a retry delay, if any)."""
    if isinstance(exc, QuotaExceededError):
        return ((RETRY_PUSHBACK, str(max(math.ceil(exc.retry_after * 1000), 1))),)
    return ()
