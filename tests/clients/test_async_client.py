"""fairq.AsyncClient against an in-process fake over real gRPC."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import grpc
import grpc.aio
import pytest

import fairq
from fairq.v1 import admin_pb2, scheduler_pb2

if TYPE_CHECKING:
    from .conftest import AioFake

# How long a test waits for something that should happen at once; only a
# failing test ever waits this long.
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


async def test_generate_streams_typed_events(aio_fake: AioFake) -> None:
    async with fairq.AsyncClient(aio_fake.target, user="alice") as client:
        events = [e async for e in client.generate("m", "hi", max_tokens=8)]
    assert events == STANDARD_EVENTS


async def test_generate_sends_the_request(aio_fake: AioFake) -> None:
    async with fairq.AsyncClient(aio_fake.target) as client:
        stream = client.generate(
            "m",
            messages=[("system", "be brief"), {"role": "user", "content": "hi"}],
            max_tokens=8,
            top_p=0.5,
            stop=["\n"],
            seed=7,
            ignore_eos=True,
            tier="batch",
            request_id="req-9",
        )
        [e async for e in stream]
    (request,) = aio_fake.scheduler.seen.requests
    assert request.model == "m"
    assert request.WhichOneof("input") == "messages"
    assert [(m.role, m.content) for m in request.messages.messages] == [
        ("system", "be brief"),
        ("user", "hi"),
    ]
    sampling = request.sampling
    assert (sampling.max_tokens, sampling.top_p, list(sampling.stop), sampling.seed) == (
        8,
        0.5,
        ["\n"],
        7,
    )
    assert sampling.ignore_eos
    assert not sampling.HasField("temperature")  # unset means the backend's default
    assert (request.tier, request.request_id) == ("batch", "req-9")


async def test_identity_metadata_is_sent(aio_fake: AioFake) -> None:
    async with fairq.AsyncClient(aio_fake.target, api_key="k-123", user="alice") as client:
        [e async for e in client.generate("m", "hi")]
        await client.list_backends()
    (metadata,) = aio_fake.scheduler.seen.metadata
    assert metadata["authorization"] == "Bearer k-123"
    assert metadata["x-fairq-user"] == "alice"


async def test_no_identity_metadata_without_key_or_user(aio_fake: AioFake) -> None:
    async with fairq.AsyncClient(aio_fake.target) as client:
        [e async for e in client.generate("m", "hi")]
    (metadata,) = aio_fake.scheduler.seen.metadata
    assert "authorization" not in metadata
    assert "x-fairq-user" not in metadata


@pytest.mark.parametrize(
    ("code", "error_type"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, fairq.InvalidArgumentError),
        (grpc.StatusCode.UNAUTHENTICATED, fairq.UnauthenticatedError),
        (grpc.StatusCode.PERMISSION_DENIED, fairq.PermissionDeniedError),
        (grpc.StatusCode.NOT_FOUND, fairq.NotFoundError),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, fairq.ResourceExhaustedError),
        (grpc.StatusCode.UNAVAILABLE, fairq.UnavailableError),
        (grpc.StatusCode.CANCELLED, fairq.RequestCancelledError),
        (grpc.StatusCode.INTERNAL, fairq.FairqError),
    ],
)
async def test_rpc_errors_are_wrapped(
    aio_fake: AioFake, code: grpc.StatusCode, error_type: type[fairq.FairqError]
) -> None:
    aio_fake.scheduler.behaviour.script = []
    aio_fake.scheduler.behaviour.abort = (code, "max_tokens must be > 0")
    async with fairq.AsyncClient(aio_fake.target) as client:
        with pytest.raises(fairq.FairqError) as caught:
            [e async for e in client.generate("m", "hi")]
    assert type(caught.value) is error_type
    assert caught.value.code == code
    assert caught.value.message == "max_tokens must be > 0"
    assert isinstance(caught.value.__cause__, grpc.aio.AioRpcError)


async def test_events_before_an_error_are_delivered(aio_fake: AioFake) -> None:
    aio_fake.scheduler.behaviour.script = aio_fake.scheduler.behaviour.script[:4]
    aio_fake.scheduler.behaviour.abort = (grpc.StatusCode.UNAVAILABLE, "backend vllm-a failed")
    received: list[fairq.Event] = []
    async with fairq.AsyncClient(aio_fake.target) as client:
        with pytest.raises(fairq.UnavailableError, match="backend vllm-a failed"):
            async for event in client.generate("m", "hi"):
                received.append(event)
    assert received == STANDARD_EVENTS[:4]


async def test_break_cancels_the_server_stream(aio_fake: AioFake) -> None:
    aio_fake.scheduler.behaviour.hold_open = True
    async with fairq.AsyncClient(aio_fake.target) as client:
        async for event in client.generate("m", "hi"):
            if isinstance(event, fairq.Chunk):
                break
        # The client stays open: the cancellation must come from leaving the
        # stream, not from closing the channel.
        await asyncio.wait_for(aio_fake.scheduler.cancelled.wait(), PATIENCE)


async def test_aclose_cancels_the_server_stream(aio_fake: AioFake) -> None:
    aio_fake.scheduler.behaviour.hold_open = True
    async with fairq.AsyncClient(aio_fake.target) as client:
        stream = client.generate("m", "hi")
        assert await anext(stream) == fairq.Queued(position=2)
        await stream.aclose()
        await asyncio.wait_for(aio_fake.scheduler.cancelled.wait(), PATIENCE)


async def test_task_cancellation_propagates_and_cancels_the_server_stream(
    aio_fake: AioFake,
) -> None:
    aio_fake.scheduler.behaviour.hold_open = True
    finished_script = asyncio.Event()

    async def consume(client: fairq.AsyncClient) -> None:
        async for event in client.generate("m", "hi"):
            if isinstance(event, fairq.Finished):
                finished_script.set()

    async with fairq.AsyncClient(aio_fake.target) as client:
        task = asyncio.create_task(consume(client))
        await asyncio.wait_for(finished_script.wait(), PATIENCE)
        task.cancel()
        # Never wrapped in FairqError: cancelling one's own request is not an error.
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(aio_fake.scheduler.cancelled.wait(), PATIENCE)


async def test_timeout_becomes_deadline_exceeded(aio_fake: AioFake) -> None:
    aio_fake.scheduler.behaviour.hold_open = True
    async with fairq.AsyncClient(aio_fake.target) as client:
        with pytest.raises(fairq.DeadlineExceededError) as caught:
            [e async for e in client.generate("m", "hi", timeout=0.2)]
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_unreachable_server_is_unavailable() -> None:
    async with fairq.AsyncClient("127.0.0.1:1") as client:
        with pytest.raises(fairq.UnavailableError):
            await client.list_backends(timeout=PATIENCE)


async def test_unknown_event_kinds_are_skipped(aio_fake: AioFake) -> None:
    # A response with no event set stands for a kind added by a newer server.
    aio_fake.scheduler.behaviour.script.insert(0, scheduler_pb2.GenerateResponse())
    async with fairq.AsyncClient(aio_fake.target) as client:
        events = [e async for e in client.generate("m", "hi")]
    assert events == STANDARD_EVENTS


async def test_invalid_arguments_fail_before_any_call(aio_fake: AioFake) -> None:
    async with fairq.AsyncClient(aio_fake.target) as client:
        with pytest.raises(ValueError, match="exactly one of prompt or messages"):
            client.generate("m")
    assert aio_fake.scheduler.seen.requests == []


async def test_complete_collects_the_stream(aio_fake: AioFake) -> None:
    async with fairq.AsyncClient(aio_fake.target) as client:
        completion = await client.complete("m", "hi", max_tokens=8)
    assert completion == fairq.Completion(
        text="Hello",
        finish_reason="length",
        backend_id="vllm-a",
        tier="interactive",
        request_id="r-1",
        prompt_tokens=3,
        completion_tokens=2,
        queue_seconds=0.25,
        ttft_seconds=0.5,
        total_seconds=0.75,
    )


async def test_complete_raises_the_stream_error(aio_fake: AioFake) -> None:
    aio_fake.scheduler.behaviour.abort = (grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
    aio_fake.scheduler.behaviour.script = []
    async with fairq.AsyncClient(aio_fake.target) as client:
        with pytest.raises(fairq.ResourceExhaustedError, match="queue full"):
            await client.complete("m", "hi")


async def test_retryable_error_carries_the_servers_retry_delay(aio_fake: AioFake) -> None:
    aio_fake.scheduler.behaviour.script = []
    aio_fake.scheduler.behaviour.abort = (grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
    aio_fake.scheduler.behaviour.trailers = (("grpc-retry-pushback-ms", "2500"),)
    async with fairq.AsyncClient(aio_fake.target) as client:
        with pytest.raises(fairq.RetryableError) as caught:
            await client.complete("m", "hi")
    assert type(caught.value) is fairq.ResourceExhaustedError
    assert caught.value.retry_after == 2.5


async def test_retryable_error_without_a_delay(aio_fake: AioFake) -> None:
    aio_fake.scheduler.behaviour.script = []
    aio_fake.scheduler.behaviour.abort = (grpc.StatusCode.UNAVAILABLE, "no healthy backend")
    async with fairq.AsyncClient(aio_fake.target) as client:
        with pytest.raises(fairq.UnavailableError) as caught:
            await client.complete("m", "hi")
    assert caught.value.retry_after is None


async def test_complete_rejects_a_stream_without_finished(aio_fake: AioFake) -> None:
    aio_fake.scheduler.behaviour.script = aio_fake.scheduler.behaviour.script[:-1]
    async with fairq.AsyncClient(aio_fake.target) as client:
        with pytest.raises(fairq.FairqError) as caught:
            await client.complete("m", "hi")
    assert caught.value.code == grpc.StatusCode.INTERNAL


async def test_admin_round_trip(aio_fake: AioFake) -> None:
    async with fairq.AsyncClient(aio_fake.target, api_key="admin-key") as client:
        status = await client.register_backend(
            "tgi-a",
            "tgi",
            "http://127.0.0.1:8080",
            ["m1", "m2"],
            priority_scheduling=False,
            max_in_flight=4,
        )
        listed = await client.list_backends()
        await client.deregister_backend("tgi-a", drain=True)
        after = await client.list_backends()

    backend = fairq.Backend(
        id="tgi-a",
        kind="tgi",
        base_url="http://127.0.0.1:8080",
        models=("m1", "m2"),
        priority_scheduling=False,
        max_in_flight=4,
    )
    expected = fairq.BackendStatus(
        backend=backend,
        healthy=True,
        in_flight=1,
        waiting=2.0,
        running=0.0,
        tpot_seconds=0.0,
        draining=False,
    )
    assert status == expected
    assert listed == [expected]
    assert after == []
    assert aio_fake.admin.state.deregistered == [("tgi-a", True)]
    (metadata,) = aio_fake.admin.state.seen.metadata
    assert metadata["authorization"] == "Bearer admin-key"


async def test_register_sends_the_proto_kind(aio_fake: AioFake) -> None:
    async with fairq.AsyncClient(aio_fake.target) as client:
        await client.register_backend("vllm-a", "vllm", "http://x", ["m"], priority_scheduling=True)
    sent = aio_fake.admin.state.backends["vllm-a"]
    assert sent.kind == admin_pb2.BACKEND_KIND_VLLM
    assert sent.priority_scheduling


async def test_admin_errors_are_wrapped(aio_fake: AioFake) -> None:
    async with fairq.AsyncClient(aio_fake.target) as client:
        with pytest.raises(fairq.NotFoundError) as caught:
            await client.deregister_backend("nope")
    assert caught.value.message == "no backend 'nope'"
    assert isinstance(caught.value.__cause__, grpc.aio.AioRpcError)


async def test_a_given_channel_is_used_and_left_open(aio_fake: AioFake) -> None:
    async with grpc.aio.insecure_channel(aio_fake.target) as channel:
        async with fairq.AsyncClient("ignored", channel=channel, user="bob") as client:
            await client.list_backends()
        # Still open after the client closed: the caller owns it.
        async with fairq.AsyncClient("ignored", channel=channel) as client:
            assert [e async for e in client.generate("m", "hi")] == STANDARD_EVENTS


async def test_credentials_and_channel_are_exclusive(aio_fake: AioFake) -> None:
    async with grpc.aio.insecure_channel(aio_fake.target) as channel:
        with pytest.raises(ValueError, match="not both"):
            fairq.AsyncClient("x", channel=channel, credentials=grpc.ssl_channel_credentials())
