"""What :class:`fairq.Client` and :class:`fairq.AsyncClient` share.

As httpx's ``BaseClient`` serves its ``Client`` and ``AsyncClient``, this base
holds everything but the I/O: option handling (an address with or without TLS,
or a ready channel), the identity metadata, and :func:`client_method`, which
turns a method declared once in ``fairq._calls`` (arguments in, request and
answer conversion out) into a method of a client. Each client then only
runs calls: blocking in ``fairq._sync_client``, awaited in
``fairq._async_client``. Errors are translated by ``fairq._errors`` and
events by ``fairq._events`` for both.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

import grpc

from fairq._calls import StreamCall, UnaryCall
from fairq._requests import build_metadata
from fairq.v1 import admin_pb2_grpc, scheduler_pb2_grpc

__all__: list[str] = []

_ChannelT = TypeVar("_ChannelT")
_ClientT = TypeVar("_ClientT")
_CallT = TypeVar("_CallT")
_ResultT = TypeVar("_ResultT")
_P = ParamSpec("_P")


class BaseClient(Generic[_ChannelT]):
    """Options, metadata and stubs, over the channel type of a client."""

    def __init__(
        self,
        target: str,
        *,
        api_key: str | None = None,
        user: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        channel: _ChannelT | None = None,
    ) -> None:
        """Open the client (its channel opens lazily, at the first call).

        Args:
            target: The server address, e.g. ``"127.0.0.1:50051"``. Unused when
                ``channel`` is given.
            api_key: Sent as ``authorization: Bearer <api_key>`` on every call.
            user: Sent as ``x-fairq-user`` on every call; servers without API
                keys (local development) take it as the caller's identity.
            credentials: TLS credentials; without them the channel is insecure.
            channel: A ready channel to use instead of opening one
                (``grpc.Channel`` for :class:`fairq.Client`,
                ``grpc.aio.Channel`` for :class:`fairq.AsyncClient`). The
                caller keeps ownership: ``close()`` does not close it.

        Raises:
            ValueError: Both ``credentials`` and ``channel`` were given.

        """
        if channel is not None and credentials is not None:
            raise ValueError("pass credentials or a ready channel, not both")
        self._owns_channel = channel is None
        if channel is None:
            channel = self._open_channel(target, credentials)
        self._channel: _ChannelT = channel
        self._metadata = build_metadata(api_key, user)
        # The generated stubs serve both channel kinds; only the I/O below
        # touches them, and the clients type what it returns.
        self._scheduler: Any = scheduler_pb2_grpc.SchedulerStub(channel)  # type: ignore[call-overload]
        self._admin: Any = admin_pb2_grpc.AdminStub(channel)  # type: ignore[call-overload]

    @staticmethod
    def _open_channel(target: str, credentials: grpc.ChannelCredentials | None) -> _ChannelT:
        """Open a channel of this client's kind (secure when credentials are given)."""
        raise NotImplementedError

    def _unary_call(self, call: UnaryCall[Any]) -> Any:
        """Return the pending ``Admin`` call (blocking or awaitable, as the channel is)."""
        method = getattr(self._admin, call.rpc)
        return method(call.request, metadata=self._metadata, timeout=call.timeout)

    def _stream_call(self, call: StreamCall) -> Any:
        """Return the ``Generate`` stream (iterable or async-iterable, as the channel is)."""
        return self._scheduler.Generate(call.request, metadata=self._metadata, timeout=call.timeout)


def client_method(
    declared: Callable[_P, _CallT],
    run: Callable[[_ClientT, _CallT], _ResultT],
    *,
    name: str | None = None,
    doc: str | None = None,
) -> Callable[Concatenate[_ClientT, _P], _ResultT]:
    """Make a client method of a call declared in ``fairq._calls``.

    The method takes the declaration's arguments, builds the call at once (so
    bad arguments raise before any I/O) and hands it to ``run``, the client's
    I/O. It keeps the declaration's signature and docstring, or ``name`` and
    ``doc`` when given (``complete`` is ``generate`` run to the end).
    """

    @functools.wraps(declared)
    def method(self: _ClientT, /, *args: _P.args, **kwargs: _P.kwargs) -> _ResultT:
        return run(self, declared(*args, **kwargs))

    signature = inspect.signature(declared)
    self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    # inspect.signature and help() read this first; without it they would
    # follow __wrapped__ to a declaration that has no self to drop when bound.
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[self_parameter, *signature.parameters.values()],
        return_annotation=inspect.Signature.empty,
    )
    if name is not None:
        method.__name__ = method.__qualname__ = name
    if doc is not None:
        method.__doc__ = doc
    mark_coroutine = getattr(inspect, "markcoroutinefunction", None)  # Python 3.12+
    if mark_coroutine is not None and inspect.iscoroutinefunction(run):
        # The method returns run's coroutine: say so to those who ask.
        mark_coroutine(method)
    return method
