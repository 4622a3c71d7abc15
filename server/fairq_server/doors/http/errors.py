"""OpenAI-style error answers of the HTTP door, and the one table from fairq's errors to them.

The body is what the OpenAI API and its SDKs expect::

    {"error": {"message": "...", "type": "invalid_request_error", "param": null, "code": null}}

=========================  ======  ==========================  ===============
error                      status  type                        code
=========================  ======  ==========================  ===============
InvalidRequestError        400     invalid_request_error
UnauthenticatedError       401     authentication_error        invalid_api_key
PermissionDeniedError      403     permission_error
ModelNotFoundError         404     not_found_error             model_not_found
QueueFullError             429     rate_limit_exceeded         queue_full
QuotaExceededError         429     rate_limit_exceeded         rate_limit_exceeded
NoBackendError             503     service_unavailable_error
QueueTimeoutError          504     timeout_error               queue_timeout
ShuttingDownError          503     service_unavailable_error
SlowClientError            429     rate_limit_exceeded
InternalError              500     internal_error
BackendFailedError         by the backend's failure kind (``_BACKEND``)
anything else              500     internal_error              ("internal error")
=========================  ======  ==========================  ===============

A 400's ``param`` names the offending field where one is known (``max_tokens``,
``messages[2].role``).

The gRPC door answers the same errors with the matching gRPC status
(:mod:`fairq_server.doors.grpc.status`), so both doors agree on what kind of failure a request met.
Queue caps (429) and "no healthy backend" (503) carry ``Retry-After``; a quota or budget
refusal's ``Retry-After`` is its own delay (whole seconds, rounded up). A backend's own HTTP
error answer before its stream began is passed through unchanged
(:class:`~fairq_server.backends.passthrough.BackendHttpError`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from aiohttp import web

from fairq_server import errors as domain
from fairq_server.errors import BackendFailure

__all__ = ["HttpError", "error_body", "error_for", "error_response"]

_BAD_REQUEST = (400, "invalid_request_error", None)
_NOT_FOUND = (404, "not_found_error", "model_not_found")
# Every 429 has one type, whatever the limit (the code says which): OpenAI's API answers
# its own limits with code ``rate_limit_exceeded``, and a client that tells refusals apart
# by type must not need to know fairq's several causes.
_RATE_LIMITED = "rate_limit_exceeded"
_TOO_MANY = (429, _RATE_LIMITED, None)
_UNAVAILABLE = (503, "service_unavailable_error", None)
_INTERNAL = (500, "internal_error", None)

# fairq's error -> (HTTP status, OpenAI error type, OpenAI error code).
_HTTP: dict[type[domain.SchedulerError], tuple[int, str, str | None]] = {
    domain.InvalidRequestError: _BAD_REQUEST,
    domain.UnauthenticatedError: (401, "authentication_error", "invalid_api_key"),
    domain.PermissionDeniedError: (403, "permission_error", None),
    domain.ModelNotFoundError: _NOT_FOUND,
    domain.QueueFullError: (429, _RATE_LIMITED, "queue_full"),
    domain.QuotaExceededError: (429, _RATE_LIMITED, "rate_limit_exceeded"),
    domain.NoBackendError: _UNAVAILABLE,
    domain.QueueTimeoutError: (504, "timeout_error", "queue_timeout"),
    domain.ShuttingDownError: _UNAVAILABLE,
    domain.SlowClientError: _TOO_MANY,
    domain.InternalError: _INTERNAL,
}
_BACKEND: dict[BackendFailure, tuple[int, str, str | None]] = {
    BackendFailure.UNAVAILABLE: _UNAVAILABLE,
    BackendFailure.OVERLOADED: _TOO_MANY,
    BackendFailure.INVALID_REQUEST: _BAD_REQUEST,
    BackendFailure.NOT_FOUND: _NOT_FOUND,
    BackendFailure.FAILED: _INTERNAL,
}
_RETRY_AFTER = frozenset({429, 503})


class HttpError(Exception):
    """An error the door answers itself (body too large, slow body, bad JSON, ...).

    Args:
        status: the HTTP status.
        message: what went wrong, for the caller.
        type_: the OpenAI error type.
        param: the offending field, if one.
        code: a machine-readable code, if one.
        retry_after: seconds for ``Retry-After`` (None: the door's default).

    """

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code


def error_body(message: str, type_: str, *, param: str | None = None, code: Any = None) -> bytes:
    """Return the JSON body of an OpenAI-style error."""
    doc = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return json.dumps(doc).encode()


def error_for(exc: Exception) -> HttpError:
    """Return the HTTP error of any exception a request met (unknown ones are 500)."""
    if isinstance(exc, HttpError):
        return exc
    found = domain.door_entry(exc, _HTTP, _BACKEND)
    if found is None:
        return HttpError(500, "internal error", "internal_error")
    (status, type_, code), message = found
    if status == 401:  # authentication names gRPC metadata; here they are headers
        message = message.replace(" metadata", " header")
    retry = math.ceil(exc.retry_after) if isinstance(exc, domain.QuotaExceededError) else None
    param = exc.param if isinstance(exc, domain.InvalidRequestError) else None
    return HttpError(status, message, type_, param=param, code=code, retry_after=retry)


def error_response(error: HttpError, retry_after: int = 1) -> web.Response:
    """Return the HTTP response of ``error`` (``Retry-After`` on 429 and 503)."""
    if error.retry_after is not None:
        retry_after = max(error.retry_after, 1)
    headers = {"retry-after": str(retry_after)} if error.status in _RETRY_AFTER else None
    return web.Response(
        status=error.status,
        body=error_body(error.message, error.type, param=error.param, code=error.code),
        content_type="application/json",
        headers=headers,
    )
