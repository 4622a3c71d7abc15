"""Errors raised by the fairq clients.

Every gRPC failure (``grpc.RpcError``, including ``grpc.aio.AioRpcError``) is
translated at the client boundary into a :class:`FairqError` that keeps the
status code and the server's message, and is raised ``from`` the original
exception so the transport details stay reachable through ``__cause__``.

The exception tree, one subclass per status code that fairq's public API
documents (any other code raises :class:`FairqError` itself)::

    FairqError                     any other status, e.g. INTERNAL, UNKNOWN
    ├── RetryableError             the same request may succeed if sent again later
    │   ├── UnavailableError       UNAVAILABLE        no healthy backend, server stopping
    │   │                                             or unreachable
    │   └── ResourceExhaustedError RESOURCE_EXHAUSTED a queue cap reached, the backend
    │                                                 overloaded, the stream read too slowly
    ├── InvalidArgumentError       INVALID_ARGUMENT   bad request fields
    ├── UnauthenticatedError       UNAUTHENTICATED    missing or unknown API key
    ├── PermissionDeniedError      PERMISSION_DENIED  tier above the key's ceiling, not admin
    ├── NotFoundError              NOT_FOUND          unknown model or backend id
    ├── DeadlineExceededError      DEADLINE_EXCEEDED  the call's timeout or the queue's
    │                                                 time limit expired
    └── RequestCancelledError      CANCELLED          the server cancelled the request

Why these two codes are the retryable ones: fairq sends UNAVAILABLE and
RESOURCE_EXHAUSTED only for conditions that pass without the caller changing
anything (a backend coming back, a replica restarting, a queue draining), and
gRPC's own retry design treats UNAVAILABLE as the transient code. The others
are not retryable as they stand: INVALID_ARGUMENT, UNAUTHENTICATED,
PERMISSION_DENIED and NOT_FOUND fail the same way until the request or the
configuration changes; DEADLINE_EXCEEDED means the caller's own time budget
(or the server's queue limit) ran out while the server was busy, and resending
at once puts the request at the back of the same queue, adding load exactly
when there is too much (give it a longer timeout, or a lower tier, instead);
CANCELLED and INTERNAL say nothing about whether a second attempt would fare
better. Two caveats for retry loops: a ``Generate`` retried after some
:class:`~fairq.Chunk` events starts over (the backend generates, and the
caller is charged for, the text again), and gRPC itself reports a message
over its size limit as RESOURCE_EXHAUSTED, which no retry cures; bound the
attempts.

A caller cancelling its own request (leaving a stream early, or an
``asyncio.CancelledError`` in its task) is not an error and is never wrapped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

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
    "RetryableError",
    "UnauthenticatedError",
    "UnavailableError",
]

#: Trailing metadata key of gRPC's retry design (gRFC A6): milliseconds to wait
#: before the next attempt.
RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"


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


class RetryableError(FairqError):
    """The same request may succeed if sent again after a pause.

    Attributes:
        retry_after: Seconds the server asked the caller to wait before trying
            again (gRPC's ``grpc-retry-pushback-ms`` trailer), or ``None`` when
            it named no delay: then back off as usual (exponentially, with
            jitter).

    """

    def __init__(
        self, code: grpc.StatusCode, message: str, *, retry_after: float | None = None
    ) -> None:
        super().__init__(code, message)
        self.retry_after = retry_after


class InvalidArgumentError(FairqError):
    """The request was malformed or outside the server's limits."""


class UnauthenticatedError(FairqError):
    """The API key was missing or not recognised."""


class PermissionDeniedError(FairqError):
    """The principal may not do this (e.g. a tier above its ceiling, or admin calls)."""


class NotFoundError(FairqError):
    """The model or backend named in the request does not exist."""


class ResourceExhaustedError(RetryableError):
    """A queue cap was reached, the backend was overloaded, or the stream was read too slowly."""


class UnavailableError(RetryableError):
    """No healthy backend can serve the model, or the server is stopping or unreachable."""


class DeadlineExceededError(FairqError):
    """The call's deadline, or the server's limit on time in its queue, expired."""


class RequestCancelledError(FairqError):
    """The server cancelled the request."""


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


def error_for_status(
    code: grpc.StatusCode, message: str, *, retry_after: float | None = None
) -> FairqError:
    """Build the most specific :class:`FairqError` for a status code.

    ``retry_after`` is kept by the retryable errors and ignored by the others.
    """
    error_type = _ERRORS_BY_CODE.get(code, FairqError)
    if issubclass(error_type, RetryableError):
        return error_type(code, message, retry_after=retry_after)
    return error_type(code, message)


def retry_after_from(trailers: Iterable[tuple[str, str | bytes]] | None) -> float | None:
    """Return the delay a ``grpc-retry-pushback-ms`` trailer asks for, in seconds.

    A missing, malformed or negative value gives ``None``: gRPC's retry design
    reads a negative pushback as "do not retry", which is the caller's call to
    make here, so it is reported as no advice rather than as a delay.
    """
    for key, value in trailers or ():
        if key != RETRY_PUSHBACK_KEY:
            continue
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        if text.isascii() and text.isdigit():
            return int(text) / 1000
        return None
    return None


def translate_rpc_error(exc: grpc.RpcError) -> FairqError:
    """Translate a gRPC exception into a :class:`FairqError`.

    The caller raises the result ``from exc``.
    """
    # A bare grpc.RpcError carries no status at runtime (its stub claims
    # otherwise); only the call objects that grpc actually raises do.
    if isinstance(exc, grpc.aio.AioRpcError | grpc.Call):
        retry_after = retry_after_from(exc.trailing_metadata())
        return error_for_status(exc.code(), exc.details() or "", retry_after=retry_after)
    return FairqError(grpc.StatusCode.UNKNOWN, str(exc))


@contextlib.contextmanager
def translated_errors() -> Iterator[None]:
    """Raise any ``grpc.RpcError`` of the block as its :class:`FairqError`, ``from`` it."""
    try:
        yield
    except grpc.RpcError as exc:
        raise translate_rpc_error(exc) from exc
