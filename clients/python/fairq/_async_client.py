"""The asyncio client: ``grpc.aio`` under the shared base of ``fairq._base_client``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import grpc
import grpc.aio

from fairq import _calls, _entitlement
from fairq._base_client import BaseClient, client_method
from fairq._calls import StreamCall, UnaryCall
from fairq._errors import translated_errors
from fairq._events import Completion, CompletionBuilder, Event, events_from_proto

if TYPE_CHECKING:
    # typing.Self is 3.11+; the client installs on 3.10 too (annotations are not evaluated).
    from typing import Self

__all__ = ["AsyncClient"]

_T = TypeVar("_T")


class AsyncClient(BaseClient[grpc.aio.Channel]):
    """An asyncio client for fairq's ``Scheduler`` and ``Admin`` services.

    Use it as an async context manager, or call :meth:`close` when done::

        async with fairq.AsyncClient("127.0.0.1:50051", user="alice") as client:
            async for event in client.generate("m", "Hello", max_tokens=16):
                ...

    Its constructor, shared with :class:`fairq.Client` and documented on
    ``__init__``, takes ``target`` and, by keyword, ``api_key``, ``user``, and
    ``credentials`` or a ready ``grpc.aio.Channel`` as ``channel``.
    """

    @staticmethod
    def _open_channel(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.aio.Channel:
        if credentials is None:
            return grpc.aio.insecure_channel(target)
        return grpc.aio.secure_channel(target, credentials)

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

    async def _stream(self, call: StreamCall) -> AsyncGenerator[Event, None]:
        stream = self._stream_call(call)
        try:
            with translated_errors():
                async for response in stream:
                    for event in events_from_proto(response):
                        yield event
        finally:
            # A no-op once the stream has ended. Otherwise the consumer left
            # early (break, aclose, an exception, task cancellation), and the
            # server must learn it to release the request's slot.
            stream.cancel()

    async def _collect(self, call: StreamCall) -> Completion:
        builder = CompletionBuilder()
        async with contextlib.aclosing(self._stream(call)) as events:
            async for event in events:
                builder.add(event)
        return builder.build()

    generate = client_method(_calls.generate, _stream)
    complete = client_method(_calls.generate, _collect, name="complete", doc=_calls.COMPLETE_DOC)

    async def _unary(self, call: UnaryCall[_T]) -> _T:
        with translated_errors():
            response = await self._unary_call(call)
        return call.convert(response)

    register_backend = client_method(_calls.register_backend, _unary)
    deregister_backend = client_method(_calls.deregister_backend, _unary)
    queue_snapshot = client_method(_calls.queue_snapshot, _unary)
    list_backends = client_method(_calls.list_backends, _unary)
    set_team = client_method(_entitlement.set_team, _unary)
    delete_team = client_method(_entitlement.delete_team, _unary)
    list_teams = client_method(_entitlement.list_teams, _unary)
    set_limit = client_method(_entitlement.set_limit, _unary)
    delete_limit = client_method(_entitlement.delete_limit, _unary)
    list_limits = client_method(_entitlement.list_limits, _unary)
    audit_log = client_method(_entitlement.audit_log, _unary)
