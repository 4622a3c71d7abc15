"""Receiving a call's request message: bounded in time, decoded by fairq, refused clearly.

gRPC's own path for a unary request decodes the message before any servicer code runs: a
call that never delivers a complete message waits forever (nothing of fairq is running to
time it out), and bytes that are not the expected protobuf end as ``UNKNOWN`` with the
decoder's exception text and a traceback in the log. :class:`RequestGuard` turns every
unary-request method into its request-streaming twin at registration: fairq then reads the
single message itself, within ``request_receive_seconds``, and decodes it itself.

===========================  =====================================================
the call                     answer
===========================  =====================================================
no message in time           DEADLINE_EXCEEDED "request not received within N s"
ended without a message      INVALID_ARGUMENT "the call ended without a request message"
bytes that do not decode     INVALID_ARGUMENT "request is not a valid <type>"
===========================  =====================================================

Decoding failures are logged at most once per :data:`LOG_EVERY_SECONDS`, with a count:
they arrive before authentication, so a line per call would let anyone fill the log.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, TypeAlias, cast

import grpc

from fairq_server.runtime.log_throttle import Throttled

__all__ = ["LOG_EVERY_SECONDS", "RequestGuard"]

log = logging.getLogger(__name__)

LOG_EVERY_SECONDS = 10.0

Context = grpc.aio.ServicerContext[Any, Any]
Deserializer = Callable[[bytes], Any]
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


def _handler(handler: Any) -> Handler:
    return handler  # type: ignore[no-any-return]


class RequestGuard:
    """Reads and decodes the request of every unary-request method itself (see module doc).

    Services are registered through :meth:`registrar` in place of the server, so the twin
    handlers are built once, at registration, and a call costs no more lookups than before
    (a server interceptor would run a coroutine per call to find them).

    Args:
        receive_seconds: how long after the call opened its request message may arrive.

    """

    def __init__(self, receive_seconds: float) -> None:
        self.receive_seconds = receive_seconds
        self._throttled = Throttled(LOG_EVERY_SECONDS, log)

    def registrar(self, server: grpc.aio.Server) -> grpc.aio.Server:
        """Return what to pass as ``server`` to a generated ``add_*Servicer_to_server``.

        It offers only the two methods generated code calls (typed as the server for them).
        """
        return cast(grpc.aio.Server, _Registrar(self, server))

    def guard(self, method: str, handler: Handler) -> Handler:
        """Return the request-streaming twin of a unary-request ``handler`` (others as is)."""
        if handler.request_streaming:
            return handler
        return self._guard(method, handler)

    def _guard(self, method: str, handler: Handler) -> Handler:
        decode: Deserializer = handler.request_deserializer or (lambda raw: raw)
        serialize = handler.response_serializer
        if not handler.response_streaming:
            unary: Any = handler.unary_unary

            async def unary_response(_requests: object, context: Context) -> Any:
                request = await self._receive(method, decode, context)
                return await unary(request, context)

            return _handler(grpc.stream_unary_rpc_method_handler(unary_response, None, serialize))
        streaming: Any = handler.unary_stream
        if inspect.isasyncgenfunction(streaming):

            async def stream_response(_requests: object, context: Context) -> AsyncIterator[Any]:
                request = await self._receive(method, decode, context)
                async for response in streaming(request, context):
                    yield response

            return _handler(grpc.stream_stream_rpc_method_handler(stream_response, None, serialize))

        # A servicer that writes with context.write() and returns nothing (health Watch).
        async def written_response(_requests: object, context: Context) -> None:
            request = await self._receive(method, decode, context)
            await streaming(request, context)

        return _handler(grpc.stream_stream_rpc_method_handler(written_response, None, serialize))

    async def _receive(self, method: str, decode: Deserializer, context: Context) -> Any:
        try:
            async with asyncio.timeout(self.receive_seconds):
                raw = await context.read()
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"request not received within {self.receive_seconds:g} s",
            )
        if raw is grpc.aio.EOF:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "the call ended without a request message"
            )
        try:
            return decode(raw)
        except Exception as exc:  # protobuf's DecodeError, or whatever a decoder raises
            name = method.rpartition("/")[2]
            self._throttled.warning(
                "undecodable request to %s from %s: %s", method, context.peer(), type(exc).__name__
            )
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"request is not a valid {name} request message"
            )


class _Registrar:
    """Stands in for the server in generated ``add_*Servicer_to_server`` functions."""

    def __init__(self, guard: RequestGuard, server: grpc.aio.Server) -> None:
        self._guard = guard
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_Generic(self._guard, h) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Handler]) -> None:
        guarded = {
            name: self._guard.guard(f"/{service}/{name}", handler)
            for name, handler in handlers.items()
        }
        self._server.add_registered_method_handlers(service, guarded)


class _Generic(grpc.GenericRpcHandler):
    """A generic handler whose unary-request handlers are guarded (built once per method)."""

    def __init__(self, guard: RequestGuard, inner: grpc.GenericRpcHandler) -> None:
        self._guard = guard
        self._inner = inner
        self._cache: dict[str, tuple[Handler, Handler]] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Handler | None:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        method: str = handler_call_details.method
        cached = self._cache.get(method)
        if cached is None or cached[0] is not handler:
            cached = (handler, self._guard.guard(method, handler))
            self._cache[method] = cached
        return cached[1]
