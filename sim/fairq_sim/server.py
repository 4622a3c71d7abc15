"""Run a simulated backend on loopback: inside the current event loop, or in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from types import TracebackType

import uvicorn

from fairq_sim.app import create_app, sim_state
from fairq_sim.config import SimConfig
from fairq_sim.engine import Engine
from fairq_sim.state import SimState

__all__ = ["SimServer", "ThreadedSimServer", "bind_socket"]


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """Return a listening TCP socket; port 0 picks a free one.

    Listening before the HTTP server starts means the port is known at once and early
    connections wait in the backlog instead of being refused.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio only sets TCP_NODELAY on accepted sockets whose proto is
    # IPPROTO_TCP, and without it Nagle's algorithm adds ~40 ms to every small response.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class SimServer:
    """A simulated backend served by uvicorn on loopback, in the running event loop.

    Use as ``async with SimServer(SimConfig(...)) as sim: ... sim.url ...`` or call
    :meth:`start` and :meth:`stop`. The config object stays live: fault fields and ``speed``
    may be changed while it runs.

    Args:
        config: What to simulate (default: vLLM mode, ``tiny-cpu`` profile).
        host: Interface to bind.
        port: Port to bind; 0 picks a free one.

    Attributes:
        config: The live configuration.
        url: ``http://HOST:PORT`` once started, else ``""``.
        port: The bound port once started.

    """

    def __init__(
        self, config: SimConfig | None = None, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.config = config if config is not None else SimConfig()
        self.app = create_app(self.config)
        self.host = host
        self.port = port
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._socket: socket.socket | None = None

    @property
    def state(self) -> SimState:
        """Engine, runner and metrics of this backend."""
        return sim_state(self.app)

    @property
    def engine(self) -> Engine:
        """The simulated engine (``running_count``, ``waiting_count``, ``kv.usage``, ...)."""
        return self.state.engine

    async def start(self) -> None:
        """Bind, run the app's startup, and start accepting connections.

        Raises:
            RuntimeError: If already started.
            OSError: If the address cannot be bound.

        """
        if self._server is not None:
            raise RuntimeError("SimServer already started")
        sock = bind_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        config.load()
        server.lifespan = config.lifespan_class(config)
        # Drive uvicorn's own startup/shutdown rather than serve(): serve() would capture
        # SIGINT/SIGTERM process-wide and poll for exit every 100 ms.
        try:
            await server.startup(sockets=[sock])
        except SystemExit as exc:  # uvicorn exits the process when lifespan startup fails
            sock.close()
            raise RuntimeError("simulator failed to start") from exc
        await server.on_tick(0)  # sets the default Date/Server headers
        self._server = server
        self._socket = sock

    async def stop(self) -> None:
        """End every open stream, close connections and stop the engine (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        # Streams end now (EngineClosedError) so that connections can close promptly.
        await self.state.shutdown()
        await server.shutdown(sockets=[self._socket] if self._socket else None)
        self._socket = None

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


class ThreadedSimServer:
    """A :class:`SimServer` on its own event loop in a daemon thread, for synchronous code.

    Use as ``with ThreadedSimServer(SimConfig(...)) as sim: requests.get(sim.url + ...)``.

    Args:
        config: What to simulate.

    """

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config if config is not None else SimConfig()
        self.url = ""
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    def start(self) -> str:
        """Start the thread and return the URL once the server accepts connections."""
        self._thread = threading.Thread(target=self._run, name="sim-server", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise RuntimeError("simulator thread failed to start") from self._error
        return self.url

    def stop(self) -> None:
        """Stop the server and join the thread."""
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to start(); the thread must not die silently
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with SimServer(self.config) as server:
            self.url = server.url
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> ThreadedSimServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
