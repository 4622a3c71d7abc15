"""fairq.Client against an in-process threaded grpc.server fake.

grpcio-testing is not a dependency of the project, and a real server on
127.0.0.1:0 exercises the same channel code that users run.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import grpc
import pytest

import fairq

if TYPE_CHECKING:
    from .conftest import SyncFake

PATIENCE = 5.0

STANDARD_EVENTS = [
    fairq.Queued(position=2),
    fairq.Queued(position=0),
    fairq.Started(backend_id="vllm-a", queue_seconds=0.25, tier="interactive", request_id="r-1"),
    fairq.Chunk(text="Hel"),
    fairq.Chunk(text="lo"),
    fairq.Finished(
        finish_reason="length",
        prompt_tokens=3,
        completion_tokens=2,
        queue_seconds=0.25,
        ttft_seconds=0.5,
        total_seconds=0.75,
    ),
]


def test_generate_streams_typed_events(sync_fake: SyncFake) -> None:
    with fairq.Client(sync_fake.target) as client:
        assert list(client.generate("m", "hi", max_tokens=8)) == STANDARD_EVENTS
    (request,) = sync_fake.scheduler.seen.requests
    assert (request.model, request.prompt, request.sampling.max_tokens) == ("m", "hi", 8)


def test_identity_metadata_is_sent(sync_fake: SyncFake) -> None:
    with fairq.Client(sync_fake.target, api_key="k-1", user="bob") as client:
        list(client.generate("m", "hi"))
    (metadata,) = sync_fake.scheduler.seen.metadata
    assert metadata["authorization"] == "Bearer k-1"
    assert metadata["x-fairq-user"] == "bob"


@pytest.mark.parametrize(
    ("code", "error_type"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, fairq.InvalidArgumentError),
        (grpc.StatusCode.PERMISSION_DENIED, fairq.PermissionDeniedError),
        (grpc.StatusCode.UNAVAILABLE, fairq.UnavailableError),
        (grpc.StatusCode.DATA_LOSS, fairq.FairqError),
    ],
)
def test_rpc_errors_are_wrapped(
    sync_fake: SyncFake, code: grpc.StatusCode, error_type: type[fairq.FairqError]
) -> None:
    sync_fake.scheduler.behaviour.script = sync_fake.scheduler.behaviour.script[:1]
    sync_fake.scheduler.behaviour.abort = (code, "tier 'interactive' is above your ceiling")
    received: list[fairq.Event] = []
    with fairq.Client(sync_fake.target) as client, pytest.raises(fairq.FairqError) as caught:
        for event in client.generate("m", "hi"):
            received.append(event)
    assert received == STANDARD_EVENTS[:1]
    assert type(caught.value) is error_type
    assert (caught.value.code, caught.value.message) == (
        code,
        "tier 'interactive' is above your ceiling",
    )
    assert isinstance(caught.value.__cause__, grpc.RpcError)


def test_retryable_error_carries_the_servers_retry_delay(sync_fake: SyncFake) -> None:
    sync_fake.scheduler.behaviour.script = []
    sync_fake.scheduler.behaviour.abort = (grpc.StatusCode.UNAVAILABLE, "server stopping")
    sync_fake.scheduler.behaviour.trailers = (("grpc-retry-pushback-ms", "250"),)
    with fairq.Client(sync_fake.target) as client, pytest.raises(fairq.UnavailableError) as caught:
        client.complete("m", "hi")
    assert isinstance(caught.value, fairq.RetryableError)
    assert caught.value.retry_after == 0.25


def test_break_cancels_the_server_stream(sync_fake: SyncFake) -> None:
    sync_fake.scheduler.behaviour.hold_open = True
    with fairq.Client(sync_fake.target) as client:
        for event in client.generate("m", "hi"):
            if isinstance(event, fairq.Started):
                break
        assert sync_fake.scheduler.cancelled.wait(PATIENCE)


def test_close_cancels_the_server_stream(sync_fake: SyncFake) -> None:
    sync_fake.scheduler.behaviour.hold_open = True
    with fairq.Client(sync_fake.target) as client:
        stream = client.generate("m", "hi")
        assert next(stream) == fairq.Queued(position=2)
        stream.close()
        assert sync_fake.scheduler.cancelled.wait(PATIENCE)


def test_timeout_becomes_deadline_exceeded(sync_fake: SyncFake) -> None:
    sync_fake.scheduler.behaviour.hold_open = True
    with fairq.Client(sync_fake.target) as client, pytest.raises(fairq.DeadlineExceededError):
        list(client.generate("m", "hi", timeout=0.2))


def test_complete_collects_the_stream(sync_fake: SyncFake) -> None:
    with fairq.Client(sync_fake.target) as client:
        completion = client.complete("m", messages=[{"role": "user", "content": "hi"}])
    assert (completion.text, completion.backend_id, completion.completion_tokens) == (
        "Hello",
        "vllm-a",
        2,
    )


def test_admin_round_trip(sync_fake: SyncFake) -> None:
    with fairq.Client(sync_fake.target, api_key="admin") as client:
        status = client.register_backend("vllm-a", "vllm", "http://127.0.0.1:8000", ["m"])
        assert client.list_backends() == [status]
        client.deregister_backend("vllm-a")
        assert client.list_backends() == []
        with pytest.raises(fairq.NotFoundError, match="no backend 'vllm-a'"):
            client.deregister_backend("vllm-a")
    assert status.backend.kind == "vllm"
    assert status.backend.models == ("m",)
    assert sync_fake.admin.state.deregistered == [("vllm-a", False)]


def test_a_given_channel_is_used_and_left_open(sync_fake: SyncFake) -> None:
    with grpc.insecure_channel(sync_fake.target) as channel:
        with fairq.Client("ignored", channel=channel) as client:
            client.list_backends()
        with fairq.Client("ignored", channel=channel) as client:
            assert list(client.generate("m", "hi")) == STANDARD_EVENTS


def test_credentials_and_channel_are_exclusive() -> None:
    with (
        contextlib.closing(grpc.insecure_channel("127.0.0.1:1")) as channel,
        pytest.raises(ValueError, match="not both"),
    ):
        fairq.Client("x", channel=channel, credentials=grpc.ssl_channel_credentials())


async def test_usable_inside_a_running_event_loop(sync_fake: SyncFake) -> None:
    # The sync client must not start or need an event loop of its own, so it
    # also works (blocking) from code that is already inside one.
    asyncio.get_running_loop()
    with fairq.Client(sync_fake.target) as client:
        assert client.complete("m", "hi").text == "Hello"
