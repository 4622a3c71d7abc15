"""The two doors' tables from fairq's errors to their wire, and the outcome label they share."""

from __future__ import annotations

import json

import grpc
import pytest

from fairq_server import errors
from fairq_server.doors.grpc.status import status_for, trailers_for
from fairq_server.doors.http.errors import error_for, error_response
from fairq_server.errors import BackendError, BackendFailure

# Every error a request can end with, as the gRPC and HTTP doors answer it.
_ANSWERS: list[tuple[errors.SchedulerError, grpc.StatusCode, tuple[int, str, str | None]]] = [
    (errors.InvalidRequestError("bad"), grpc.StatusCode.INVALID_ARGUMENT,
     (400, "invalid_request_error", None)),
    (errors.UnauthenticatedError("who"), grpc.StatusCode.UNAUTHENTICATED,
     (401, "authentication_error", "invalid_api_key")),
    (errors.PermissionDeniedError("no"), grpc.StatusCode.PERMISSION_DENIED,
     (403, "permission_error", None)),
    (errors.ModelNotFoundError("none"), grpc.StatusCode.NOT_FOUND,
     (404, "not_found_error", "model_not_found")),
    (errors.QueueFullError("full"), grpc.StatusCode.RESOURCE_EXHAUSTED,
     (429, "rate_limit_exceeded", "queue_full")),
    (errors.QuotaExceededError("over", retry_after=1.5, limit="tokens_per_minute"),
     grpc.StatusCode.RESOURCE_EXHAUSTED, (429, "rate_limit_exceeded", "rate_limit_exceeded")),
    (errors.NoBackendError("down"), grpc.StatusCode.UNAVAILABLE,
     (503, "service_unavailable_error", None)),
    (errors.QueueTimeoutError("late"), grpc.StatusCode.DEADLINE_EXCEEDED,
     (504, "timeout_error", "queue_timeout")),
    (errors.ShuttingDownError("bye"), grpc.StatusCode.UNAVAILABLE,
     (503, "service_unavailable_error", None)),
    (errors.SlowClientError("slow"), grpc.StatusCode.RESOURCE_EXHAUSTED,
     (429, "rate_limit_exceeded", None)),
    (errors.InternalError(), grpc.StatusCode.INTERNAL, (500, "internal_error", None)),
]  # fmt: skip
_BACKEND: dict[BackendFailure, tuple[grpc.StatusCode, tuple[int, str, str | None]]] = {
    BackendFailure.UNAVAILABLE: (grpc.StatusCode.UNAVAILABLE,
                                 (503, "service_unavailable_error", None)),
    BackendFailure.OVERLOADED: (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                (429, "rate_limit_exceeded", None)),
    BackendFailure.INVALID_REQUEST: (grpc.StatusCode.INVALID_ARGUMENT,
                                     (400, "invalid_request_error", None)),
    BackendFailure.NOT_FOUND: (grpc.StatusCode.NOT_FOUND,
                               (404, "not_found_error", "model_not_found")),
    BackendFailure.FAILED: (grpc.StatusCode.INTERNAL, (500, "internal_error", None)),
}  # fmt: skip


@pytest.mark.parametrize("exc,code,http", _ANSWERS, ids=lambda v: type(v).__name__)
def test_each_door_answers_an_error_in_its_own_terms(
    exc: errors.SchedulerError, code: grpc.StatusCode, http: tuple[int, str, str | None]
) -> None:
    assert status_for(exc) == (code, str(exc))
    answer = error_for(exc)
    assert (answer.status, answer.type, answer.code, answer.message) == (*http, str(exc))
    # The outcome label (metrics, access log) is the gRPC status name, whichever door.
    assert exc.outcome == code.name.lower()


@pytest.mark.parametrize("kind", list(BackendFailure))
def test_a_failed_backend_is_answered_by_its_failure_kind(kind: BackendFailure) -> None:
    code, http = _BACKEND[kind]
    cause = BackendError("backend b failed: out of memory", kind)
    for exc in (errors.BackendFailedError(cause), cause):
        assert status_for(exc) == (code, str(cause))
        answer = error_for(exc)
        assert (answer.status, answer.type, answer.code) == http
        assert answer.message == str(cause)
    assert errors.BackendFailedError(cause).outcome == code.name.lower()


@pytest.mark.parametrize(
    "exc", [ValueError("secret detail"), errors.SchedulerError("x"), errors.EvictedError("y")]
)
def test_anything_unmapped_is_internal_and_tells_nothing(exc: Exception) -> None:
    assert status_for(exc) == (grpc.StatusCode.INTERNAL, "internal error")
    answer = error_for(exc)
    assert (answer.status, answer.type, answer.message) == (500, "internal_error", "internal error")


def test_every_error_class_is_in_the_tables() -> None:
    """A new subclass of SchedulerError must be given an answer in both doors."""
    mapped = {type(exc) for exc, _, _ in _ANSWERS} | {errors.BackendFailedError}
    leaves = {
        cls
        for cls in vars(errors).values()
        if isinstance(cls, type)
        and issubclass(cls, errors.SchedulerError)
        and cls not in (errors.SchedulerError, errors.RejectedError, errors.EvictedError)
    }
    assert leaves == mapped


def test_a_quota_refusal_carries_its_retry_delay_on_each_door() -> None:
    exc = errors.QuotaExceededError("over", retry_after=12.25, limit="tokens_per_minute")
    assert trailers_for(exc) == (("grpc-retry-pushback-ms", "12250"),)
    assert trailers_for(errors.QueueFullError("full")) == ()
    response = error_response(error_for(exc), retry_after=1)
    assert response.headers["retry-after"] == "13"  # whole seconds, rounded up
    short = errors.QuotaExceededError("over", retry_after=0.01, limit="requests_per_minute")
    assert error_response(error_for(short), retry_after=5).headers["retry-after"] == "1"


def test_every_429_has_one_openai_type_and_the_code_names_the_cause() -> None:
    """A client tells rate limits apart from other refusals by one type, as with OpenAI."""
    answers = [error_for(exc) for exc, _, _ in _ANSWERS]
    answers.append(error_for(BackendError("busy", BackendFailure.OVERLOADED)))
    limited = [a for a in answers if a.status == 429]
    assert len(limited) == 4
    assert {a.type for a in limited} == {"rate_limit_exceeded"}
    assert {a.code for a in limited} == {"queue_full", "rate_limit_exceeded", None}


def test_a_bad_request_names_its_field_in_param() -> None:
    answer = error_for(errors.InvalidRequestError("max_tokens must be ...", param="max_tokens"))
    body = json.loads(error_response(answer).body)  # type: ignore[arg-type]
    assert body["error"]["param"] == "max_tokens"
    assert (
        json.loads(error_response(error_for(errors.InvalidRequestError("x"))).body)[  # type: ignore[arg-type]
            "error"
        ]["param"]
        is None
    )
