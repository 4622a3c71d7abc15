"""The asyncio client, built on ``grpc.aio``; ``fairq._sync_client`` is its sync twin.

Both send identical requests (built in ``fairq._requests``), turn responses
into the typed events of ``fairq._events`` and raise :class:`fairq.FairqError`
(see ``fairq._errors`` for the tree) for any gRPC failure.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import grpc
import grpc.aio

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

__all__ = ["AsyncClient"]

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


class AsyncClient:
    """An asyncio client for fairq's ``Scheduler`` and ``Admin`` services.

    Use it as an async context manager, or call :meth:`close` when done::

        async with fairq.AsyncClient("127.0.0.1:50051", user="alice") as client:
            async for event in client.generate("m", "Hello", max_tokens=16):
                ...

    Args:
        target: The server address, e.g. ``"127.0.0.1:50051"``. Unused when
            ``channel`` is given.
        api_key: Sent as ``authorization: Bearer <api_key>`` on every call.
        user: Sent as ``x-fairq-user`` on every call; servers without API keys
            (local development) take it as the caller's identity.
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
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        if channel is not None and credentials is not None:
            raise ValueError("pass credentials or a ready channel, not both")
        self._owns_channel = channel is None
        if channel is None:
            if credentials is None:
                channel = grpc.aio.insecure_channel(target)
            else:
                channel = grpc.aio.secure_channel(target, credentials)
        self._channel = channel
        self._metadata = build_metadata(api_key, user)
        self._scheduler = scheduler_pb2_grpc.SchedulerStub(channel)
        self._admin = admin_pb2_grpc.AdminStub(channel)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel if this client opened it; in-flight calls are cancelled."""
        if self._owns_channel:
            await self._channel.close()

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
    ) -> AsyncGenerator[Event, None]:
        """Submit one request and stream its lifecycle events.

        The call starts when iteration starts. Leaving the iteration early
        cancels it on the server, which frees the request's queue slot or aborts
        its backend stream: at once with ``aclose()`` (or ``contextlib.aclosing``),
        and when the generator is garbage-collected after a plain ``break``.

        Args:
            model: Model name, as registered by a backend.
            prompt: Plain-text prompt (completions API).
            messages: Chat messages as ``(role, content)`` pairs or mappings with
                ``role`` and ``content`` keys. Exactly one of ``prompt`` and
                ``messages`` must be given.
            max_tokens: Upper bound on generated tokens (> 0).
            temperature: Sampling temperature, 0 to 2.
            top_p: Nucleus sampling mass, in (0, 1].
            stop: Up to 4 stop strings.
            seed: Sampling seed.
            ignore_eos: Keep generating past end-of-sequence (vLLM only).
            tier: Requested tier, e.g. ``"batch"``; empty means the caller's
                highest allowed tier. It may be lower than that, never higher.
            request_id: Caller-chosen id for logs; fairq makes one if empty.
            timeout: Deadline for the whole stream in seconds, time queued
                included; ``None`` for none. It is sent as the gRPC deadline,
                so the server also learns it and can drop a queued request
                whose caller has given up (which ``asyncio.timeout`` cannot).

        Unset sampling parameters take the backend's defaults.

        Returns:
            An async generator of :class:`Queued`, :class:`Started`,
            :class:`Chunk` and :class:`Finished` events.

        Raises:
            ValueError: Neither or both of ``prompt`` and ``messages`` (raised
                here, before any call).
            TypeError: ``stop`` or ``messages`` is a plain string (likewise).
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

    async def _stream(
        self, request: scheduler_pb2.GenerateRequest, timeout: float | None
    ) -> AsyncGenerator[Event, None]:
        call = self._scheduler.Generate(request, metadata=self._metadata, timeout=timeout)
        try:
            async for response in call:
                event = event_from_proto(response)
                if event is not None:
                    yield event
        except grpc.RpcError as exc:
            raise translate_rpc_error(exc) from exc
        finally:
            # A no-op once the stream has ended. Otherwise the consumer left
            # early (break, aclose, an exception, task cancellation), and the
            # server must learn it to release the request's slot.
            call.cancel()

    async def complete(
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

        Takes the same arguments as :meth:`generate`.

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
        async with contextlib.aclosing(events):
            async for event in events:
                builder.add(event)
        return builder.build()

    async def register_backend(
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

        Args:
            id: Unique backend id, e.g. ``"vllm-a"``.
            kind: ``"vllm"`` or ``"tgi"``.
            base_url: Base URL, e.g. ``"http://127.0.0.1:8000"``.
            models: Models the backend serves.
            priority_scheduling: The backend schedules by vLLM's ``priority``
                (``--scheduling-policy priority``); fairq cannot detect this.
            max_in_flight: Cap on requests fairq keeps in flight on it (0 = none).
            timeout: Deadline for the call in seconds.

        Returns:
            The backend's status right after registration.

        Raises:
            ValueError: Unknown ``kind``.
            TypeError: ``models`` is a plain string.
            FairqError: The call failed, e.g. ``PermissionDeniedError``.

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
        response = await self._unary(self._admin.RegisterBackend, request, timeout)
        return backend_status_from_proto(response.status)

    async def deregister_backend(
        self, id: str, *, drain: bool = False, timeout: float | None = None
    ) -> None:
        """Remove a backend (admin only).

        Args:
            id: The backend's id.
            drain: Stop sending it new work and return only once its in-flight
                requests have finished.
            timeout: Deadline for the call in seconds (draining included).

        Raises:
            FairqError: The call failed, e.g. ``NotFoundError`` for an unknown id.

        """
        request = admin_pb2.DeregisterBackendRequest(id=id, drain=drain)
        await self._unary(self._admin.DeregisterBackend, request, timeout)

    async def queue_snapshot(self, *, top_users: int = 0, timeout: float | None = None) -> Snapshot:
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
        response = await self._unary(self._admin.GetQueueSnapshot, request, timeout)
        return snapshot_from_proto(response)

    async def list_backends(self, *, timeout: float | None = None) -> list[BackendStatus]:
        """Report every registered backend and its live state (admin only).

        Raises:
            FairqError: The call failed.

        """
        request = admin_pb2.ListBackendsRequest()
        response = await self._unary(self._admin.ListBackends, request, timeout)
        return [backend_status_from_proto(status) for status in response.backends]

    async def _unary(
        self,
        method: grpc.aio.UnaryUnaryMultiCallable[_Request, _Response],
        request: _Request,
        timeout: float | None,
    ) -> _Response:
        try:
            return await method(request, metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as exc:
            raise translate_rpc_error(exc) from exc
