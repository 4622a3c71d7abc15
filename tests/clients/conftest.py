"""Fakes and fixtures for the client tests.

Most client tests run against small fake Scheduler/Admin servicers served over
real gRPC on 127.0.0.1:0, an asyncio one (``aio_fake``) for ``fairq.AsyncClient``
and the Node client, and a threaded one (``sync_fake``) for ``fairq.Client``: they
can script what a real server rarely does (a status with a retry delay, an unknown
event kind). End-to-end tests use ``fairq_target``, a real fairq in process in
front of the simulator.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio

from fairq.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from fairq_sim import SimServer

from ..conftest import FairqFactory, make_config, sim_backend

pb = scheduler_pb2


def standard_script() -> list[scheduler_pb2.GenerateResponse]:
    """A whole successful stream: two queue updates, start, two chunks, finish."""
    return [
        pb.GenerateResponse(queued=pb.Queued(position=2)),
        pb.GenerateResponse(queued=pb.Queued(position=0)),
        pb.GenerateResponse(
            started=pb.Started(
                backend_id="vllm-a", queue_seconds=0.25, tier="interactive", request_id="r-1"
            )
        ),
        pb.GenerateResponse(chunk=pb.Chunk(text="Hel")),
        pb.GenerateResponse(chunk=pb.Chunk(text="lo")),
        pb.GenerateResponse(
            finished=pb.Finished(
                finish_reason="length",
                usage=pb.Usage(prompt_tokens=3, completion_tokens=2),
                timings=pb.Timings(queue_seconds=0.25, ttft_seconds=0.5, total_seconds=0.75),
            )
        ),
    ]


@dataclass
class Behaviour:
    """What a fake Generate does: send ``script``, then abort or stay open if asked."""

    script: list[scheduler_pb2.GenerateResponse] = field(default_factory=standard_script)
    abort: tuple[grpc.StatusCode, str] | None = None
    trailers: tuple[tuple[str, str], ...] = ()
    hold_open: bool = False


@dataclass
class Seen:
    """What a fake servicer received."""

    requests: list[Any] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)


def _metadata(context: Any) -> dict[str, str]:
    return {item.key: item.value for item in context.invocation_metadata()}


def _status(backend: admin_pb2.Backend) -> admin_pb2.BackendStatus:
    return admin_pb2.BackendStatus(backend=backend, healthy=True, in_flight=1, waiting=2.0)


class FakeAdminState:
    """Backend registry shared by the sync and async fake Admin servicers."""

    def __init__(self) -> None:
        self.backends: dict[str, admin_pb2.Backend] = {}
        self.deregistered: list[tuple[str, bool]] = []
        self.seen = Seen()


class AioFakeScheduler(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self) -> None:
        self.behaviour = Behaviour()
        self.seen = Seen()
        # Set when a Generate call is cancelled while its handler runs.
        self.cancelled = asyncio.Event()

    # A coroutine that writes, rather than an async generator: grpc cancels the
    # handler's task wherever it is parked (in a write, or holding the stream
    # open), so the CancelledError always reaches this code. A generator parked
    # at `yield` is dropped without one, and the done callback's cancelled()
    # reads False for a client cancellation.
    async def Generate(  # type: ignore[override]
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        self.seen.requests.append(request)
        self.seen.metadata.append(_metadata(context))
        try:
            for response in self.behaviour.script:
                await context.write(response)
            if self.behaviour.abort is not None:
                context.set_trailing_metadata(self.behaviour.trailers)
                await context.abort(*self.behaviour.abort)
            if self.behaviour.hold_open:
                await asyncio.Event().wait()  # until the client goes away
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


class AioFakeAdmin(admin_pb2_grpc.AdminServicer):
    def __init__(self) -> None:
        self.state = FakeAdminState()

    async def RegisterBackend(self, request: Any, context: Any) -> Any:
        self.state.seen.metadata.append(_metadata(context))
        self.state.backends[request.backend.id] = request.backend
        return admin_pb2.RegisterBackendResponse(status=_status(request.backend))

    async def DeregisterBackend(self, request: Any, context: Any) -> Any:
        if request.id not in self.state.backends:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no backend {request.id!r}")
        del self.state.backends[request.id]
        self.state.deregistered.append((request.id, request.drain))
        return admin_pb2.DeregisterBackendResponse()

    async def ListBackends(self, request: Any, context: Any) -> Any:
        statuses = [_status(b) for b in self.state.backends.values()]
        return admin_pb2.ListBackendsResponse(backends=statuses)


@dataclass
class AioFake:
    target: str
    scheduler: AioFakeScheduler
    admin: AioFakeAdmin


@pytest_asyncio.fixture
async def aio_fake() -> AsyncIterator[AioFake]:
    """A ``grpc.aio`` server with fake Scheduler and Admin, on the test's own loop."""
    server = grpc.aio.server()
    scheduler, admin = AioFakeScheduler(), AioFakeAdmin()
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(scheduler, server)
    admin_pb2_grpc.add_AdminServicer_to_server(admin, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield AioFake(f"127.0.0.1:{port}", scheduler, admin)
    finally:
        await server.stop(None)


class SyncFakeScheduler(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self) -> None:
        self.behaviour = Behaviour()
        self.seen = Seen()
        self.cancelled = threading.Event()

    def Generate(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.seen.requests.append(request)
        self.seen.metadata.append(_metadata(context))
        server_ended = False
        terminated = threading.Event()

        def on_termination() -> None:
            # Runs when the RPC ends for any reason. If this handler had not
            # ended it, the client did: grpc stops pulling from a cancelled
            # handler's generator, so the handler cannot observe it itself.
            if not server_ended:
                self.cancelled.set()
            terminated.set()

        context.add_callback(on_termination)
        yield from self.behaviour.script
        if self.behaviour.abort is not None:
            server_ended = True
            context.set_trailing_metadata(self.behaviour.trailers)
            context.abort(*self.behaviour.abort)
        if self.behaviour.hold_open:
            terminated.wait(timeout=30)  # until the client goes away
        server_ended = True


class SyncFakeAdmin(admin_pb2_grpc.AdminServicer):
    def __init__(self) -> None:
        self.state = FakeAdminState()

    def RegisterBackend(self, request: Any, context: Any) -> Any:
        self.state.seen.metadata.append(_metadata(context))
        self.state.backends[request.backend.id] = request.backend
        return admin_pb2.RegisterBackendResponse(status=_status(request.backend))

    def DeregisterBackend(self, request: Any, context: Any) -> Any:
        if request.id not in self.state.backends:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no backend {request.id!r}")
        del self.state.backends[request.id]
        self.state.deregistered.append((request.id, request.drain))
        return admin_pb2.DeregisterBackendResponse()

    def ListBackends(self, request: Any, context: Any) -> Any:
        statuses = [_status(b) for b in self.state.backends.values()]
        return admin_pb2.ListBackendsResponse(backends=statuses)


@dataclass
class SyncFake:
    target: str
    scheduler: SyncFakeScheduler
    admin: SyncFakeAdmin


@pytest.fixture
def sync_fake() -> Iterator[SyncFake]:
    """A threaded ``grpc.server`` with fake Scheduler and Admin."""
    executor = futures.ThreadPoolExecutor(max_workers=8)
    server = grpc.server(executor)
    scheduler, admin = SyncFakeScheduler(), SyncFakeAdmin()
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(scheduler, server)
    admin_pb2_grpc.add_AdminServicer_to_server(admin, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield SyncFake(f"127.0.0.1:{port}", scheduler, admin)
    finally:
        server.stop(None).wait()
        executor.shutdown(wait=False)


# The end-to-end fixtures: a real fairq server in front of the simulated backend.


@pytest.fixture
async def fairq_target(sim: SimServer, fairq_factory: FairqFactory) -> str:
    """Address of a running fairq gRPC server in front of the simulated backend."""
    server = await fairq_factory(make_config([sim_backend(sim)]))
    return f"127.0.0.1:{server.port}"


@pytest.fixture
def sim_model(sim: SimServer) -> str:
    """The model the simulated backend behind ``fairq_target`` serves."""
    return sim.config.model
