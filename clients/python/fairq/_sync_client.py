"""The synchronous client: the blocking ``grpc`` channel API under the shared base.

No event loop is involved: each call is a plain blocking gRPC call, so the
client is safe to use from threads and from code that already runs an event
loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import grpc

from fairq import _calls, _entitlement
from fairq._base_client import BaseClient, client_method
from fairq._calls import StreamCall, UnaryCall
from fairq._errors import translated_errors
from fairq._events import Completion, CompletionBuilder, Event, events_from_proto

if TYPE_CHECKING:
    # typing.Self is 3.11+; the client installs on 3.10 too (annotations are not evaluated).
    from typing import Self

__all__ = ["Client"]

_T = TypeVar("_T")


class Client(BaseClient[grpc.Channel]):
    """A blocking client for fairq's ``Scheduler`` and ``Admin`` services.

    Use it as a context manager, or call :meth:`close` when done::

        with fairq.Client("127.0.0.1:50051", user="alice") as client:
            print(client.complete("m", "Hello", max_tokens=16).text)

    It takes the constructor arguments of :class:`fairq.AsyncClient` (a
    ``grpc.Channel`` as ``channel``) and has the same methods, blocking.
    """

    @staticmethod
    def _open_channel(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.Channel:
        if credentials is None:
            return grpc.insecure_channel(target)
        return grpc.secure_channel(target, credentials)

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

    def _stream(self, call: StreamCall) -> Generator[Event, None, None]:
        stream = self._stream_call(call)
        try:
            with translated_errors():
                for response in stream:
                    yield from events_from_proto(response)
        finally:
            # A no-op once the stream has ended; otherwise the server must learn
            # that the consumer left, to release the request's slot.
            stream.cancel()

    def _collect(self, call: StreamCall) -> Completion:
        builder = CompletionBuilder()
        with contextlib.closing(self._stream(call)) as events:
            for event in events:
                builder.add(event)
        return builder.build()

    generate = client_method(_calls.generate, _stream)
    complete = client_method(_calls.generate, _collect, name="complete", doc=_calls.COMPLETE_DOC)

    def _unary(self, call: UnaryCall[_T]) -> _T:
        with translated_errors():
            response = self._unary_call(call)
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
