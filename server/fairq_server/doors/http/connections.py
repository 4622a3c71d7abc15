"""The HTTP door's connections: caps per door and per peer, head and idle timeouts.

aiohttp's server closes a connection only after its keep-alive timeout (about an hour by
default) and reads a request head for as long as the client takes to send it, so silent
connections and one-byte-every-few-seconds header senders would hold a descriptor each for
an hour. Every connection is therefore wrapped in :class:`_GuardedProtocol`, which

- refuses a connection beyond ``max_connections`` of the door or ``max_connections_per_peer``
  of one peer address (a ``503`` with an OpenAI error body, then the connection is closed);
- closes a connection that has no request in progress and sends nothing for
  ``idle_timeout_seconds`` (a new connection as well as a kept-alive one);
- closes a connection whose request head (request line and headers) is not complete
  ``head_timeout_seconds`` after its first byte, answering ``408``.

A request's body has its own bound (``body_timeout_seconds``, read by the handlers) and a
running request has none here (it streams for as long as generation takes). Each refusal is
counted in ``fairq_http_connections_refused_total`` by reason.

Failures to accept a connection at all (the process is out of descriptors) are reported by
asyncio's accept loop once per pending connection (a traceback each, thousands a second);
:meth:`ConnectionGuard.install_accept_log` logs them at most once per
:data:`ACCEPT_LOG_EVERY_SECONDS` with a count instead. uvloop (``fairq serve``'s default
loop) reports none: libuv accepts and closes what it cannot hold, so a client sees its
connection closed and the process recovers once descriptors are free.
"""

from __future__ import annotations

import asyncio
import logging
import time
import typing
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from fairq_server.doors.http.errors import error_body

__all__ = ["ACCEPT_LOG_EVERY_SECONDS", "ConnectionGuard", "ConnectionLimits"]

log = logging.getLogger(__name__)

ACCEPT_LOG_EVERY_SECONDS = 10.0
_ACCEPT_FAILED = "socket.accept() out of system resource"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _answer(status: str, message: str, type_: str, code: str) -> bytes:
    body = error_body(message, type_, code=code)
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class ConnectionLimits:
    """The bounds one door applies (from ``[http]``)."""

    def __init__(
        self,
        *,
        max_connections: int,
        max_connections_per_peer: int,
        head_timeout_seconds: float,
        idle_timeout_seconds: float,
    ) -> None:
        self.max_connections = max_connections
        self.max_connections_per_peer = max_connections_per_peer
        self.head_timeout_seconds = head_timeout_seconds
        self.idle_timeout_seconds = idle_timeout_seconds


class ConnectionGuard:
    """Counts a door's connections and applies :class:`ConnectionLimits` to each.

    Args:
        limits: the bounds.
        registry: where the door's connection metrics are registered.

    """

    def __init__(self, limits: ConnectionLimits, registry: CollectorRegistry) -> None:
        self.limits = limits
        self.refused = Counter(
            "fairq_http_connections_refused",
            "HTTP door connections refused or closed by fairq, by reason (door_full, "
            "peer_full, head_timeout, idle_timeout, accept_failed).",
            ["reason"],
            registry=registry,
        )
        self.open = Gauge(
            "fairq_http_connections", "Connections open on the HTTP door.", registry=registry
        )
        self._per_peer: dict[str, int] = {}
        self._total = 0
        self._by_transport: dict[asyncio.BaseTransport, _GuardedProtocol] = {}
        self._accept_next = 0.0
        self._accept_unlogged = 0

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """Return a protocol factory wrapping the connections ``inner`` makes."""
        return lambda: _GuardedProtocol(self, inner())

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Mark the connection busy while a request runs (its head is complete by then)."""
        guarded = self._by_transport.get(request.transport) if request.transport else None
        if guarded is not None:
            guarded.request_started()
        try:
            return await handler(request)
        finally:
            if guarded is not None:
                guarded.request_finished()

    def install_accept_log(self, loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
        """Throttle asyncio's accept-failure reports on ``loop``; return the undo.

        After an accept failure asyncio re-arms accepting a second later, once per failed
        attempt. When the door closes before those retries run, each would report an invalid
        descriptor with a traceback (thousands after a storm). They are dropped from the
        moment the listening socket closes (which is before the door's stop returns: its
        connections may take the whole grace to close), and the undo leaves the handler in
        place to keep dropping them, restoring the previous one only if nothing failed.
        """
        previous = loop.get_exception_handler()
        failed = False

        def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            nonlocal failed
            if context.get("message") == _ACCEPT_FAILED:
                failed = True
                self._accept_failed(context.get("exception"))
            elif _is_stale_accept_retry(context):
                return  # only a closed listening socket has no descriptor to accept on
            elif previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)

        def undo() -> None:
            if not failed:
                loop.set_exception_handler(previous)

        loop.set_exception_handler(handle)
        return undo

    def _accept_failed(self, exc: object) -> None:
        self.refused.labels("accept_failed").inc()
        now = time.monotonic()
        if now < self._accept_next:
            self._accept_unlogged += 1
            return
        more = f" ({self._accept_unlogged} more since the last such line)"
        log.error(
            "the HTTP door cannot accept connections: %s%s",
            exc,
            more if self._accept_unlogged else "",
        )
        self._accept_unlogged = 0
        self._accept_next = now + ACCEPT_LOG_EVERY_SECONDS

    # -- bookkeeping for _GuardedProtocol ---------------------------------------------------

    def _admit(self, protocol: _GuardedProtocol, peer: str) -> str | None:
        if self._total >= self.limits.max_connections:
            return "door_full"
        if self._per_peer.get(peer, 0) >= self.limits.max_connections_per_peer:
            return "peer_full"
        self._total += 1
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        assert protocol.transport is not None
        self._by_transport[protocol.transport] = protocol
        self.open.set(self._total)
        return None

    def _release(self, protocol: _GuardedProtocol, peer: str) -> None:
        self._total -= 1
        left = self._per_peer[peer] - 1
        if left:
            self._per_peer[peer] = left
        else:
            del self._per_peer[peer]
        if protocol.transport is not None:
            self._by_transport.pop(protocol.transport, None)
        self.open.set(self._total)


_REFUSALS = {
    "door_full": _answer(
        "503 Service Unavailable", "the server has too many open connections",
        "service_unavailable_error", "too_many_connections",
    ),
    "peer_full": _answer(
        "503 Service Unavailable", "too many open connections from your address",
        "service_unavailable_error", "too_many_connections",
    ),
    "head_timeout": _answer(
        "408 Request Timeout", "the request head did not arrive in time",
        "invalid_request_error", "head_timeout",
    ),
}  # fmt: skip


class _GuardedProtocol(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, the door's bounds around it."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self.transport: asyncio.Transport | None = None
        self._peer = ""
        self._admitted = False
        self._busy = False
        self._timer: asyncio.TimerHandle | None = None
        self._head_started = False

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though not necessarily a subclass of asyncio.Transport (uvloop's
        # TCPTransport is not one): use it by its interface.
        transport = typing.cast(asyncio.Transport, transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        refusal = self._guard._admit(self, self._peer)
        if refusal is not None:
            self._refuse(refusal)
            return
        self._admitted = True
        self._inner.connection_made(transport)
        self._idle()

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        if not self._busy and not self._head_started:
            # The first byte of a request head: from now on the head has its own bound.
            self._head_started = True
            self._arm(self._guard.limits.head_timeout_seconds, "head_timeout")
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._admitted else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        if self._admitted:
            self._admitted = False
            self._guard._release(self, self._peer)
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._admitted:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._admitted:
            self._inner.resume_writing()

    # -- request boundaries (from the guard's middleware) ---------------------------------

    def request_started(self) -> None:
        self._busy = True
        self._head_started = False
        self._cancel()

    def request_finished(self) -> None:
        self._busy = False
        self._idle()

    # -- timers ---------------------------------------------------------------------------

    def _idle(self) -> None:
        self._arm(self._guard.limits.idle_timeout_seconds, "idle_timeout")

    def _arm(self, seconds: float, reason: str) -> None:
        self._cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(seconds, self._expired, reason)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self, reason: str) -> None:
        self._timer = None
        transport = self.transport
        if self._busy or transport is None or transport.is_closing():
            return
        if reason == "idle_timeout" and transport.get_write_buffer_size():
            # The last answer is still being written to a slow reader: not idle yet.
            self._idle()
            return
        self._guard.refused.labels(reason).inc()
        if reason == "head_timeout":
            transport.write(_REFUSALS[reason])
        transport.close()

    def _refuse(self, reason: str) -> None:
        self._guard.refused.labels(reason).inc()
        assert self.transport is not None
        self.transport.write(_REFUSALS[reason])
        self.transport.close()


def _is_stale_accept_retry(context: dict[str, Any]) -> bool:
    """Whether ``context`` reports asyncio re-arming the accept of a socket since closed."""
    return isinstance(context.get("exception"), ValueError) and "_start_serving" in repr(
        context.get("handle")
    )
