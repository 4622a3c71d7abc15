"""Event conversion, completion building, error translation and backend mapping."""

from __future__ import annotations

import grpc
import pytest

import fairq
from fairq import _calls
from fairq._backends import backend_status_from_proto
from fairq._errors import error_for_status, retry_after_from, translate_rpc_error
from fairq._events import CompletionBuilder, event_from_proto
from fairq.v1 import admin_pb2, scheduler_pb2

pb = scheduler_pb2


@pytest.mark.parametrize(
    ("response", "event"),
    [
        (pb.GenerateResponse(queued=pb.Queued()), fairq.Queued(position=0)),
        (pb.GenerateResponse(chunk=pb.Chunk(text="")), fairq.Chunk(text="")),
        (
            pb.GenerateResponse(started=pb.Started(backend_id="b")),
            fairq.Started(backend_id="b", queue_seconds=0.0, tier="", request_id=""),
        ),
        (
            # usage/timings absent: a partial Finished still converts (to zeros).
            pb.GenerateResponse(finished=pb.Finished(finish_reason="stop")),
            fairq.Finished("stop", 0, 0, 0.0, 0.0, 0.0),
        ),
        (pb.GenerateResponse(), None),
    ],
    ids=["queued", "chunk", "started", "finished", "unknown"],
)
def test_event_from_proto(response: scheduler_pb2.GenerateResponse, event: object) -> None:
    assert event_from_proto(response) == event


def test_events_are_frozen() -> None:
    chunk = fairq.Chunk(text="a")
    with pytest.raises(AttributeError):
        chunk.text = "b"  # type: ignore[misc]


def test_completion_builder_without_started_reports_empty_fields() -> None:
    builder = CompletionBuilder()
    builder.add(fairq.Chunk("a"))
    builder.add(fairq.Queued(0))
    builder.add(fairq.Chunk("b"))
    builder.add(fairq.Finished("stop", 1, 2, 0.1, 0.2, 0.3))
    completion = builder.build()
    assert (completion.text, completion.backend_id, completion.total_seconds) == ("ab", "", 0.3)


def test_every_documented_code_has_its_own_error() -> None:
    documented = {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    }
    types = {code: type(error_for_status(code, "")) for code in documented}
    assert fairq.FairqError not in types.values()
    assert len(set(types.values())) == len(documented)
    assert all(issubclass(t, fairq.FairqError) for t in types.values())
    assert type(error_for_status(grpc.StatusCode.INTERNAL, "")) is fairq.FairqError


def test_error_text() -> None:
    error = error_for_status(grpc.StatusCode.NOT_FOUND, "unknown model 'x'")
    assert str(error) == "NOT_FOUND: unknown model 'x'"
    assert repr(error).startswith("NotFoundError(code=")


def test_bare_rpc_error_translates_to_unknown() -> None:
    # grpc.RpcError itself carries no status; only call objects do.
    error = translate_rpc_error(grpc.RpcError("boom"))
    assert (error.code, error.message) == (grpc.StatusCode.UNKNOWN, "boom")


def test_register_backend_rejects_unknown_kind_listing_the_proto_kinds() -> None:
    with pytest.raises(ValueError, match="unknown backend kind 'sglang'; valid: vllm, tgi, openai"):
        _calls.register_backend("b", "sglang", "http://x", ["m"])


def test_register_backend_rejects_a_plain_string_of_models() -> None:
    with pytest.raises(TypeError, match="models must be a sequence"):
        _calls.register_backend("b", "vllm", "http://x", "m")


def test_register_backend_sends_the_openai_kind_and_its_settings() -> None:
    call = _calls.register_backend(
        "sglang-a", "openai", "http://x", ["m"], metrics_preset="sglang", max_in_flight=4
    )
    backend = call.request.backend
    assert backend.kind == admin_pb2.BACKEND_KIND_OPENAI
    assert (backend.metrics_preset, backend.max_in_flight, list(backend.models)) == (
        "sglang",
        4,
        ["m"],
    )


def test_register_backend_sends_preempt() -> None:
    call = _calls.register_backend(
        "vllm-a", "vllm", "http://x", ["m"], max_in_flight=8, preempt=True
    )
    assert call.request.backend.preempt and call.request.backend.max_in_flight == 8
    assert not _calls.register_backend("vllm-b", "vllm", "http://x", ["m"]).request.backend.preempt


def test_unknown_backend_kind_from_the_server() -> None:
    backend = admin_pb2.Backend(id="b", kind=99)  # type: ignore[arg-type]
    status = admin_pb2.BackendStatus(backend=backend)
    assert backend_status_from_proto(status).backend.kind == "unspecified"


def test_backend_status_round_trips_every_field() -> None:
    backend = admin_pb2.Backend(
        id="o",
        kind=admin_pb2.BACKEND_KIND_OPENAI,
        base_url="http://x",
        models=["m", "n"],
        max_in_flight=3,
        metrics_preset="llamacpp",
        tpot_metric="a/b",
        api_key_env="FAIRQ_KEY",
        preempt=True,
    )
    status = backend_status_from_proto(
        admin_pb2.BackendStatus(backend=backend, healthy=False, reason="scrape failed")
    )
    assert status.backend == fairq.Backend(
        id="o",
        kind="openai",
        base_url="http://x",
        models=("m", "n"),
        priority_scheduling=False,
        max_in_flight=3,
        metrics_preset="llamacpp",
        tpot_metric="a/b",
        api_key_env="FAIRQ_KEY",
        preempt=True,
    )
    assert (status.healthy, status.reason) == (False, "scrape failed")


@pytest.mark.parametrize(
    ("code", "retryable"),
    [
        (grpc.StatusCode.UNAVAILABLE, True),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, False),
        (grpc.StatusCode.INVALID_ARGUMENT, False),
        (grpc.StatusCode.CANCELLED, False),
        (grpc.StatusCode.INTERNAL, False),
    ],
)
def test_retryable_group(code: grpc.StatusCode, retryable: bool) -> None:
    assert isinstance(error_for_status(code, ""), fairq.RetryableError) is retryable


def test_existing_error_names_keep_their_place() -> None:
    # Callers catching the old names keep working; the group is added above two of them.
    assert issubclass(fairq.UnavailableError, fairq.FairqError)
    assert issubclass(fairq.ResourceExhaustedError, fairq.RetryableError)
    assert not issubclass(fairq.DeadlineExceededError, fairq.RetryableError)


@pytest.mark.parametrize(
    ("trailers", "seconds"),
    [
        ((("grpc-retry-pushback-ms", "1500"),), 1.5),
        ((("other", "1"), ("grpc-retry-pushback-ms", b"0")), 0.0),
        ((("grpc-retry-pushback-ms", "-1"),), None),
        ((("grpc-retry-pushback-ms", "soon"),), None),
        ((), None),
        (None, None),
    ],
)
def test_retry_after_from_the_pushback_trailer(
    trailers: tuple[tuple[str, str | bytes], ...] | None, seconds: float | None
) -> None:
    assert retry_after_from(trailers) == seconds


def test_chunk_extra_converts_whole_numbers_to_int() -> None:
    chunk = pb.Chunk(text="")
    chunk.extra.update({"choices": [{"index": 0, "tool_calls": [{"index": 0}], "p": 0.5}]})
    event = event_from_proto(pb.GenerateResponse(chunk=chunk))
    assert event == fairq.Chunk(
        text="", extra={"choices": [{"index": 0, "tool_calls": [{"index": 0}], "p": 0.5}]}
    )
    assert isinstance(event, fairq.Chunk)
    assert hash(event) == hash(fairq.Chunk(text=""))  # extra stays out of the hash
