"""What a backend can do wrong, in the backend's own terms.

Adapters raise :class:`BackendError` with a :class:`BackendFailure` kind; they know nothing of
gRPC. The API layer maps each kind to a status code in one table
(:func:`fairq_server.errors.status_for`), and the dispatcher decides from ``retryable`` whether
another backend may take the request.
"""

from __future__ import annotations

import enum

__all__ = ["BackendError", "BackendFailure"]


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
