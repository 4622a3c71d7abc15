"""OpenAI-style error answers of the HTTP door, and the one table from fairq's errors to them.

The body is what the OpenAI API and its SDKs expect::

    {"error": {"message": "...", "type": "invalid_request_error", "param": null, "code": null}}

fairq's errors are first mapped to their gRPC status (:func:`fairq_server.errors.status_for`,
the single table of the gRPC door), then the status to an HTTP code here, so both doors
always agree on what kind of failure a request met. Queue caps (429) and "no healthy backend"
(503) carry ``Retry-After``. A backend's own HTTP error answer before its stream began is
passed through unchanged (:class:`~fairq_server.backends.passthrough.BackendHttpError`).
"""

from __future__ import annotations

import json
from typing import Any

import grpc
from aiohttp import web

from fairq_server.errors import QueueFullError, QueueTimeoutError, status_for

__all__ = ["HttpError", "error_body", "error_for", "error_response"]

# gRPC status -> (HTTP status, OpenAI error type).
_HTTP: dict[grpc.StatusCode, tuple[int, str]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable_error"),
    grpc.StatusCode.FAILED_PRECONDITION: (503, "service_unavailable_error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout_error"),
    grpc.StatusCode.CANCELLED: (499, "cancelled"),
    grpc.StatusCode.INTERNAL: (500, "internal_error"),
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

    """

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        *,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code


def error_body(message: str, type_: str, *, param: str | None = None, code: Any = None) -> bytes:
    """Return the JSON body of an OpenAI-style error."""
    doc = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return json.dumps(doc).encode()


def error_for(exc: BaseException) -> HttpError:
    """Return the HTTP error of any exception a request met (unknown ones are 500)."""
    if isinstance(exc, HttpError):
        return exc
    code, message = status_for(exc)
    status, type_ = _HTTP.get(code, (500, "internal_error"))
    error_code = None
    if isinstance(exc, QueueFullError):
        error_code = "queue_full"
    elif isinstance(exc, QueueTimeoutError):
        error_code = "queue_timeout"
    elif status == 404:
        error_code = "model_not_found"
    elif status == 401:
        error_code = "invalid_api_key"
        # Authentication speaks of gRPC metadata; here the same values are HTTP headers.
        message = message.replace(" metadata", " header")
    return HttpError(status, message, type_, code=error_code)


def error_response(error: HttpError, retry_after: int = 1) -> web.Response:
    """Return the HTTP response of ``error`` (``Retry-After`` on 429 and 503)."""
    headers = {"retry-after": str(retry_after)} if error.status in _RETRY_AFTER else None
    return web.Response(
        status=error.status,
        body=error_body(error.message, error.type, param=error.param, code=error.code),
        content_type="application/json",
        headers=headers,
    )
