"""Event conversion, completion building, error translation and backend mapping."""

from __future__ import annotations

import grpc
import pytest

import fairq
from fairq._backends import backend_status_from_proto, build_backend
from fairq._errors import error_for_status, translate_rpc_error
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


def test_build_backend_rejects_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown backend kind 'sglang'; valid: vllm, tgi"):
        build_backend("b", "sglang", "http://x", ["m"], priority_scheduling=False, max_in_flight=0)  # type: ignore[arg-type]


def test_build_backend_rejects_a_plain_string_of_models() -> None:
    with pytest.raises(TypeError, match="models must be a sequence"):
        build_backend("b", "vllm", "http://x", "m", priority_scheduling=False, max_in_flight=0)


def test_unknown_backend_kind_from_the_server() -> None:
    backend = admin_pb2.Backend(id="b", kind=99)  # type: ignore[arg-type]
    status = admin_pb2.BackendStatus(backend=backend)
    assert backend_status_from_proto(status).backend.kind == "unspecified"
