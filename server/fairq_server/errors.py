"""The errors fairq raises, with no transport in them: each door maps them to its own codes.

Exception tree::

    SchedulerError                  a request could not be served         outcome label
    ├── RejectedError               refused before it was queued
    │   ├── InvalidRequestError     malformed or out-of-range input       invalid_argument
    │   ├── UnauthenticatedError    missing or unknown API key            unauthenticated
    │   ├── PermissionDeniedError   tier above the key's ceiling, admin   permission_denied
    │   ├── ModelNotFoundError      no backend serves the model           not_found
    │   ├── QueueFullError          a queue cap was reached               resource_exhausted
    │   ├── QuotaExceededError      a hard quota or budget was reached    resource_exhausted
    │   └── NoBackendError          no healthy backend for the model      unavailable
    └── EvictedError                ended after it was queued
        ├── QueueTimeoutError       waited longer than the queue TTL      deadline_exceeded
        ├── ShuttingDownError       the server is stopping                unavailable
        ├── SlowClientError         the caller left too much text unread  resource_exhausted
        ├── InternalError           a fault inside fairq (logged)         internal
        └── BackendFailedError      the backend failed                    from its failure kind

    ConfigError (a ValueError)      the configuration is invalid; names the offending key
    BackendError                    a backend failed, of a BackendFailure kind (adapters)

Every :class:`SchedulerError` carries an ``outcome``: the label of ``fairq_requests_total``
and of the access log's ``outcome`` field, the same whichever door the request came through
(the names are those of the gRPC status the gRPC door answers with, in lower case).

Backend adapters raise :class:`BackendError` with a :class:`BackendFailure` kind, in the
backend's own terms (they know nothing of either door); the dispatcher decides from its
``retryable`` whether another backend may take the request, and wraps it in
:class:`BackendFailedError` when it gives up on the request. Each door maps these classes to
its wire in one table of its own (through :func:`door_entry`): gRPC status codes in
:mod:`fairq_server.doors.grpc.status`, HTTP statuses and OpenAI error bodies in
:mod:`fairq_server.doors.http.errors`. Anything unmapped is an internal error there;
``asyncio.CancelledError`` is never caught by either: a cancelled client is not an error.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeVar

__all__ = [
    "BackendError",
    "BackendFailedError",
    "BackendFailure",
    "ConfigError",
    "EvictedError",
    "InternalError",
    "InvalidRequestError",
    "ModelNotFoundError",
    "NoBackendError",
    "PermissionDeniedError",
    "QueueFullError",
    "QueueTimeoutError",
    "QuotaExceededError",
    "RejectedError",
    "SchedulerError",
    "ShuttingDownError",
    "SlowClientError",
    "UnauthenticatedError",
    "door_entry",
]


class BackendFailure(enum.Enum):
    """Why a backend did not serve a request; the value doubles as a log and metric label."""

    UNAVAILABLE = "unavailable"  # unreachable, reset, 5xx, or the stream ended early
    OVERLOADED = "overloaded"  # the backend said so (HTTP 429, TGI "overloaded")
    INVALID_REQUEST = "invalid_request"  # the backend refused the request itself (4xx)
    NOT_FOUND = "not_found"  # the backend does not know the model or path
    FAILED = "failed"  # the generation failed, or the backend broke its protocol


class BackendError(Exception):
    """The backend refused or failed a request, or a scrape.

    Attributes:
        kind: what went wrong.
        retryable: the failure says nothing about the request itself (connection refused,
            reset, 5xx, overloaded), so another backend may succeed.

    """

    def __init__(self, message: str, kind: BackendFailure, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable


class ConfigError(ValueError):
    """The configuration file is invalid; the message names the offending key."""


class SchedulerError(Exception):
    """Base class of every error fairq reports to a caller.

    Attributes:
        outcome: the request's outcome label in metrics and the access log.

    """

    outcome: str = "internal"


class RejectedError(SchedulerError):
    """The request was refused before it entered a queue."""


class InvalidRequestError(RejectedError):
    """The request is malformed or a value is out of range.

    Args:
        message: what is wrong, naming the field.
        param: the offending field as the caller wrote it (``max_tokens``,
            ``messages[2].role``), if one; the HTTP door sends it as OpenAI's ``param``.

    """

    outcome = "invalid_argument"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class UnauthenticatedError(RejectedError):
    """No valid API key was presented."""

    outcome = "unauthenticated"


class PermissionDeniedError(RejectedError):
    """The principal may not do this (tier ceiling, admin-only call)."""

    outcome = "permission_denied"


class ModelNotFoundError(RejectedError):
    """No registered backend serves the requested model."""

    outcome = "not_found"


class QueueFullError(RejectedError):
    """A per-user or global queue cap was reached."""

    outcome = "resource_exhausted"


class QuotaExceededError(RejectedError):
    """A hard quota or budget of the user or its team is reached (at admission or dispatch).

    Attributes:
        retry_after: seconds until the limit's window has room again (each door tells the
            caller: gRPC ``grpc-retry-pushback-ms``, HTTP ``Retry-After``).
        limit: the limit's kind (``tokens_per_minute``, ``budget_per_day``, ...).

    """

    outcome = "resource_exhausted"

    def __init__(self, message: str, *, retry_after: float, limit: str) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.limit = limit


class NoBackendError(RejectedError):
    """Every backend of the model is unhealthy."""

    outcome = "unavailable"


class EvictedError(SchedulerError):
    """The request was queued or running and then ended without finishing."""


class QueueTimeoutError(EvictedError):
    """The request waited in the queue longer than allowed."""

    outcome = "deadline_exceeded"


class ShuttingDownError(EvictedError):
    """The server stopped before the request could run."""

    outcome = "unavailable"


class SlowClientError(EvictedError):
    """The caller left more generated text unread than fairq holds for it."""

    outcome = "resource_exhausted"


class InternalError(EvictedError):
    """A fault inside fairq ended the request; the details are in fairq's log only."""

    def __init__(self, message: str = "internal error") -> None:
        super().__init__(message)


# A failed backend's outcome, by the kind of its failure.
_BACKEND_OUTCOME: dict[BackendFailure, str] = {
    BackendFailure.UNAVAILABLE: "unavailable",
    BackendFailure.OVERLOADED: "resource_exhausted",
    BackendFailure.INVALID_REQUEST: "invalid_argument",
    BackendFailure.NOT_FOUND: "not_found",
    BackendFailure.FAILED: "internal",
}


class BackendFailedError(EvictedError):
    """The backend refused or failed the request.

    Attributes:
        cause: the backend's error, in the backend's terms.

    """

    def __init__(self, cause: BackendError) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.outcome = _BACKEND_OUTCOME[cause.kind]


_Entry = TypeVar("_Entry")


def door_entry(
    exc: Exception,
    by_error: Mapping[type[SchedulerError], _Entry],
    by_failure: Mapping[BackendFailure, _Entry],
) -> tuple[_Entry, str] | None:
    """Return a door's table entry for ``exc`` and the message that goes with it.

    A backend's failure (raised by an adapter, or wrapped by the dispatcher) is looked up by its
    kind and speaks in the backend's words; any other error by its nearest class in
    ``by_error``. None: nothing maps it (the door answers with an internal error).
    """
    if isinstance(exc, BackendFailedError | BackendError):
        cause = exc.cause if isinstance(exc, BackendFailedError) else exc
        return by_failure[cause.kind], str(cause)
    for cls in type(exc).__mro__:
        entry = by_error.get(cls)
        if entry is not None:
            return entry, str(exc)
    return None
