"""The HTTP door's server: an aiohttp application on its own listen address.

aiohttp's server is used because fairq already runs aiohttp's client towards every backend
(one HTTP stack, one C parser, no extra runtime dependency); ``docs/design/http-door.md``
gives the measured cost against the alternatives.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

from fairq_server.doors.access_log import RequestLog
from fairq_server.doors.http.connections import ConnectionGuard, ConnectionLimits
from fairq_server.doors.http.door import OpenAIHandlers
from fairq_server.doors.http.errors import HttpError, error_response
from fairq_server.identity.auth import Authenticator
from fairq_server.port import CorePort

__all__ = ["HttpDoor", "Mounted"]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer routing errors (unknown path, wrong method) and bugs as OpenAI-style JSON."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = f"{request.method} {request.path[:200]}: {exc.reason}"
        if exc.status == 404 and not request.path.startswith("/v1/"):
            message += (
                "; fairq serves the OpenAI API under /v1 (an OpenAI client's base URL is "
                "http://HOST:PORT/v1)"
            )
        return error_response(HttpError(exc.status, message, code=exc.reason.lower()))
    except ConnectionResetError:
        raise
    except Exception:
        log.exception("HTTP request %s %s failed", request.method, request.path[:200])
        return error_response(HttpError(500, "internal error", "internal_error"))


class Mounted(Protocol):
    """An application served beside the OpenAI API on the door's port (the console is one)."""

    def add_to(self, router: web.UrlDispatcher) -> None:
        """Add its routes to the door's router (before the door starts)."""

    async def start(self) -> None:
        """Start its background work (the door has started)."""

    async def stop(self) -> None:
        """Stop its background work (before the door stops)."""


class HttpDoor:
    """Serves the OpenAI-compatible API of ``core`` on ``listen``.

    Args:
        core: the scheduling core (shared with the gRPC door).
        auth: the authenticator (shared with the gRPC door).
        listen: ``host:port``; port 0 picks a free one.
        request_log: where finished requests are reported (shared with the gRPC door).
        console: the operator's console, served under ``/console`` (None: not served).
        serving: whether the process serves requests now (``GET /health``: 200 or 503);
            None: whenever the door is up.

    Attributes:
        port: the bound port once started.

    """

    def __init__(
        self,
        core: CorePort,
        auth: Authenticator,
        listen: str,
        request_log: RequestLog | None = None,
        console: Mounted | None = None,
        serving: Callable[[], bool] | None = None,
    ) -> None:
        self._listen = listen
        self._serving = serving or (lambda: True)
        self._console = console
        self.port = 0
        settings = core.config.http
        self._guard = ConnectionGuard(
            ConnectionLimits(
                max_connections=settings.max_connections,
                max_connections_per_peer=settings.max_connections_per_peer,
                head_timeout_seconds=settings.head_timeout_seconds,
                idle_timeout_seconds=settings.idle_timeout_seconds,
            ),
            core.telemetry.registry,
        )
        self._undo_accept_log: Callable[[], None] | None = None
        handlers = OpenAIHandlers(core, auth, request_log)
        app = web.Application(
            middlewares=[self._guard.middleware, _json_errors],
            # Bodies are read and bounded by the handlers (limits.max_body_bytes).
            client_max_size=core.config.limits.max_body_bytes,
        )
        app.router.add_post("/v1/chat/completions", handlers.chat)
        app.router.add_post("/v1/completions", handlers.completions)
        app.router.add_get("/v1/models", handlers.models)
        app.router.add_get("/v1/models/{model:.+}", handlers.model)
        app.router.add_get("/health", self._health)
        if console is not None:
            console.add_to(app.router)
        # A client that disconnects cancels its handler: that is how a queued or running
        # request learns that nobody waits for it any more.
        # At stop, running streams have had the server's grace period already.
        self._runner = web.AppRunner(
            app,
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=1.0,
            # The guard closes idle and slow connections; aiohttp's own keep-alive (an hour
            # by default, counted from a connection's last answer) stays as a backstop just
            # beyond the guard's longest bound.
            keepalive_timeout=settings.idle_timeout_seconds + settings.head_timeout_seconds + 1,
        )

    async def _health(self, request: web.Request) -> web.Response:
        """``GET /health`` (and ``HEAD``), for load balancers and probes, as vLLM has it.

        200 while the process serves requests, 503 while its dispatcher loop is down (it
        restarts by itself) and once it is stopping, so a balancer sends new requests
        elsewhere. Backends' health is not part of it: a replica with no healthy backend is
        not better replaced by another (they share the backends), and its callers get 503
        "no healthy backend" with ``Retry-After`` per request. No key is needed, and the
        answer tells nothing beyond serving or not.
        """
        if self._serving():
            return web.json_response({"status": "serving"})
        return web.json_response({"status": "not serving"}, status=503)

    async def start(self) -> None:
        """Bind and start serving.

        Raises:
            OSError: the address cannot be bound.

        """
        host, _, port = self._listen.rpartition(":")
        await self._runner.setup()
        site = _GuardedSite(self._runner, self._guard, host.strip("[]") or "127.0.0.1", int(port))
        await site.start()
        self._undo_accept_log = self._guard.install_accept_log(asyncio.get_running_loop())
        if self._console is not None:
            await self._console.start()
        self.port = int(self._runner.addresses[0][1])
        log.info("fairq HTTP door on %s (port %d)", self._listen, self.port)

    async def stop(self) -> None:
        """Stop accepting and close every connection (queued requests were answered)."""
        if self._console is not None:
            await self._console.stop()
        await self._runner.cleanup()
        if self._undo_accept_log is not None:
            self._undo_accept_log()
            self._undo_accept_log = None


class _GuardedSite(web.BaseSite):
    """A TCP site whose connections go through the door's :class:`ConnectionGuard`."""

    __slots__ = ("_guard", "_host", "_port")

    def __init__(self, runner: web.AppRunner, guard: ConnectionGuard, host: str, port: int) -> None:
        super().__init__(runner, backlog=2048)
        self._guard = guard
        self._host = host
        self._port = port

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._guard.factory(server), self._host, self._port, backlog=self._backlog
        )
