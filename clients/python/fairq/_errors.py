"""Errors raised by the fairq clients.

Every gRPC failure (``grpc.RpcError``, including ``grpc.aio.AioRpcError``) is
translated at the client boundary into a :class:`FairqError` that keeps the
status code and the server's message, and is raised ``from`` the original
exception so the transport details stay reachable through ``__cause__``.

The exception tree, one subclass per status code that fairq's public API
documents (any other code raises :class:`FairqError` itself)::

    FairqError                     any gRPC status, e.g. INTERNAL, UNKNOWN
    ├── InvalidArgumentError       INVALID_ARGUMENT   bad request fields
    ├── UnauthenticatedError       UNAUTHENTICATED    missing or unknown API key
    ├── PermissionDeniedError      PERMISSION_DENIED  tier above the key's ceiling, not admin
    ├── NotFoundError              NOT_FOUND          unknown model or backend id
    ├── ResourceExhaustedError     RESOURCE_EXHAUSTED queue caps reached
    ├── UnavailableError           UNAVAILABLE        no healthy backend, server unreachable
    ├── DeadlineExceededError      DEADLINE_EXCEEDED  the call's timeout expired
    └── RequestCancelledError      CANCELLED          the server cancelled the request

A caller cancelling its own request (leaving a stream early, or an
``asyncio.CancelledError`` in its task) is not an error and is never wrapped.
"""

from __future__ import annotations

import grpc
import grpc.aio

__all__ = [
    "DeadlineExceededError",
    "FairqError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "RequestCancelledError",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "UnavailableError",
]


class FairqError(Exception):
    """A fairq call failed with a gRPC status.

    Attributes:
        code: The gRPC status code, e.g. ``grpc.StatusCode.INVALID_ARGUMENT``.
        message: The server's human-readable message (gRPC "details").

    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class InvalidArgumentError(FairqError):
    """The request was malformed or outside the server's limits."""


class UnauthenticatedError(FairqError):
    """The API key was missing or not recognised."""


class PermissionDeniedError(FairqError):
    """The principal may not do this (e.g. a tier above its ceiling, or admin calls)."""


class NotFoundError(FairqError):
    """The model or backend named in the request does not exist."""


class ResourceExhaustedError(FairqError):
    """A queue cap was reached; retrying later may succeed."""


class UnavailableError(FairqError):
    """No healthy backend can serve the model, or the server cannot be reached."""


class DeadlineExceededError(FairqError):
    """The call's deadline expired before it completed."""


class RequestCancelledError(FairqError):
    """The server cancelled the request (e.g. while shutting down)."""


_ERRORS_BY_CODE: dict[grpc.StatusCode, type[FairqError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.CANCELLED: RequestCancelledError,
}


def error_for_status(code: grpc.StatusCode, message: str) -> FairqError:
    """Build the most specific :class:`FairqError` for a status code."""
    return _ERRORS_BY_CODE.get(code, FairqError)(code, message)


def translate_rpc_error(exc: grpc.RpcError) -> FairqError:
    """Translate a gRPC exception into a :class:`FairqError`.

    The caller raises the result ``from exc``.
    """
    # A bare grpc.RpcError carries no status at runtime (its stub claims
    # otherwise); only the call objects that grpc actually raises do.
    if isinstance(exc, grpc.aio.AioRpcError | grpc.Call):
        return error_for_status(exc.code(), exc.details() or "")
    return FairqError(grpc.StatusCode.UNKNOWN, str(exc))
