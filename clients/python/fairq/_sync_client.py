"""The synchronous client, built on the blocking ``grpc`` channel API.

It mirrors :class:`fairq.AsyncClient` method for method; the arguments are
documented there. No event loop is involved: each call is a plain blocking
gRPC call, so the client is safe to use from threads and from code that
already runs an event loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import grpc

from fairq._backends import (
    BackendKind,
    BackendStatus,
    backend_status_from_proto,
    build_backend,
)
from fairq._errors import translate_rpc_error
from fairq._events import Completion, CompletionBuilder, Event, event_from_proto
from fairq._requests import (
    ChatMessages,
    build_generate_request,
    build_metadata,
    build_snapshot_request,
)
from fairq._snapshot import Snapshot, snapshot_from_proto
from fairq.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

if TYPE_CHECKING:
    # typing.Self is 3.11+; the client installs on 3.10 too (annotations are not evaluated).
    from typing import Self

__all__ = ["Client"]

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


class Client:
    """A blocking client for fairq's ``Scheduler`` and ``Admin`` services.

    Use it as a context manager, or call :meth:`close` when done::

        with fairq.Client("127.0.0.1:50051", user="alice") as client:
            print(client.complete("m", "Hello", max_tokens=16).text)

    Args:
        target: The server address, e.g. ``"127.0.0.1:50051"``. Unused when
            ``channel`` is given.
        api_key: Sent as ``authorization: Bearer <api_key>`` on every call.
        user: Sent as ``x-fairq-user`` on every call.
        credentials: TLS credentials; without them the channel is insecure.
        channel: A ready channel to use instead of opening one. The caller
            keeps ownership: :meth:`close` does not close it.

    Raises:
        ValueError: Both ``credentials`` and ``channel`` were given.

    """

    def __init__(
        self,
        target: str,
        *,
        api_key: str | None = None,
        user: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        channel: grpc.Channel | None = None,
    ) -> None:
        if channel is not None and credentials is not None:
            raise ValueError("pass credentials or a ready channel, not both")
        self._owns_channel = channel is None
        if channel is None:
            if credentials is None:
                channel = grpc.insecure_channel(target)
            else:
                channel = grpc.secure_channel(target, credentials)
        self._channel = channel
        self._metadata = build_metadata(api_key, user)
        self._scheduler = scheduler_pb2_grpc.SchedulerStub(channel)
        self._admin = admin_pb2_grpc.AdminStub(channel)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel if this client opened it; in-flight calls are cancelled."""
        if self._owns_channel:
            self._channel.close()

    def generate(
        self,
        model: str,
        prompt: str | None = None,
        *,
        messages: ChatMessages | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: Sequence[str] = (),
        seed: int | None = None,
        ignore_eos: bool = False,
        tier: str = "",
        request_id: str = "",
        timeout: float | None = None,
    ) -> Generator[Event, None, None]:
        """Submit one request and stream its lifecycle events.

        Arguments, events and errors as :meth:`fairq.AsyncClient.generate`.
        The call starts when iteration starts; leaving the iteration early
        (``break``, ``close()``, an exception) cancels it on the server.

        Raises:
            ValueError: Neither or both of ``prompt`` and ``messages``.
            TypeError: ``stop`` or ``messages`` is a plain string.
            FairqError: From the iteration, when the call fails.

        """
        request = build_generate_request(
            model,
            prompt,
            messages=messages,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=stop,
            seed=seed,
            ignore_eos=ignore_eos,
            tier=tier,
            request_id=request_id,
        )
        return self._stream(request, timeout)

    def _stream(
        self, request: scheduler_pb2.GenerateRequest, timeout: float | None
    ) -> Generator[Event, None, None]:
        call = self._scheduler.Generate(request, metadata=self._metadata, timeout=timeout)
        try:
            for response in call:
                event = event_from_proto(response)
                if event is not None:
                    yield event
        except grpc.RpcError as exc:
            raise translate_rpc_error(exc) from exc
        finally:
            # A no-op once the stream has ended; otherwise the server must learn
            # that the consumer left, to release the request's slot.
            call.cancel()

    def complete(
        self,
        model: str,
        prompt: str | None = None,
        *,
        messages: ChatMessages | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: Sequence[str] = (),
        seed: int | None = None,
        ignore_eos: bool = False,
        tier: str = "",
        request_id: str = "",
        timeout: float | None = None,
    ) -> Completion:
        """Run one request to the end and return the collected result.

        Raises:
            ValueError: As :meth:`generate`.
            TypeError: As :meth:`generate`.
            FairqError: The call failed.

        """
        events = self.generate(
            model,
            prompt,
            messages=messages,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=stop,
            seed=seed,
            ignore_eos=ignore_eos,
            tier=tier,
            request_id=request_id,
            timeout=timeout,
        )
        builder = CompletionBuilder()
        with contextlib.closing(events):
            for event in events:
                builder.add(event)
        return builder.build()

    def register_backend(
        self,
        id: str,
        kind: BackendKind,
        base_url: str,
        models: Sequence[str],
        *,
        priority_scheduling: bool = False,
        max_in_flight: int = 0,
        timeout: float | None = None,
    ) -> BackendStatus:
        """Register a backend, or replace the one with the same id (admin only).

        Arguments as :meth:`fairq.AsyncClient.register_backend`.

        Raises:
            ValueError: Unknown ``kind``.
            TypeError: ``models`` is a plain string.
            FairqError: The call failed.

        """
        backend = build_backend(
            id,
            kind,
            base_url,
            models,
            priority_scheduling=priority_scheduling,
            max_in_flight=max_in_flight,
        )
        request = admin_pb2.RegisterBackendRequest(backend=backend)
        response = self._unary(self._admin.RegisterBackend, request, timeout)
        return backend_status_from_proto(response.status)

    def deregister_backend(
        self, id: str, *, drain: bool = False, timeout: float | None = None
    ) -> None:
        """Remove a backend, optionally draining it first (admin only).

        Raises:
            FairqError: The call failed, e.g. ``NotFoundError`` for an unknown id.

        """
        request = admin_pb2.DeregisterBackendRequest(id=id, drain=drain)
        self._unary(self._admin.DeregisterBackend, request, timeout)

    def queue_snapshot(self, *, top_users: int = 0, timeout: float | None = None) -> Snapshot:
        """Report queue depth per model and tier, top users and backend gates (admin only).

        Args:
            top_users: How many users to list (0: the server's default, 10;
                at most 1000).
            timeout: Deadline for the call in seconds.

        Raises:
            ValueError: ``top_users`` is negative.
            FairqError: The call failed.

        """
        request = build_snapshot_request(top_users)
        response = self._unary(self._admin.GetQueueSnapshot, request, timeout)
        return snapshot_from_proto(response)

    def list_backends(self, *, timeout: float | None = None) -> list[BackendStatus]:
        """Report every registered backend and its live state (admin only).

        Raises:
            FairqError: The call failed.

        """
        response = self._unary(self._admin.ListBackends, admin_pb2.ListBackendsRequest(), timeout)
        return [backend_status_from_proto(status) for status in response.backends]

    def _unary(
        self,
        method: grpc.UnaryUnaryMultiCallable[_Request, _Response],
        request: _Request,
        timeout: float | None,
    ) -> _Response:
        try:
            return method(request, metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as exc:
            raise translate_rpc_error(exc) from exc
