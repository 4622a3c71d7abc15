"""Drive an :class:`~fairq_sim.engine.Engine` in real time on the asyncio loop.

One task loops: schedule a step, sleep until it ends, apply it, and hand each token to the
request's :class:`RequestStream`. HTTP handlers submit requests and iterate their streams; a
handler that goes away aborts its request, which frees the slot at once.

Sleeping is deadline based: if the loop wakes up late, the next step starts from the previous
deadline rather than from "now", so the steps missed run back to back until the engine is on
time again. Lateness comes from the simulator's own front end: rendering ``/metrics`` takes
about 8 ms of the loop (vLLM's full exposition), longer on a busy machine. A real engine steps
in its own process while its API server answers scrapes, so a scraper polling every 50 ms
must not slow the simulated engine down (it took a quarter of the throughput when only 10 ms
of lateness were caught up).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from fairq_sim.engine import Engine
from fairq_sim.events import TokenOutput
from fairq_sim.request import SimRequest

__all__ = ["EngineClosedError", "EngineRunner", "RequestStream"]

_log = logging.getLogger(__name__)

# Lateness up to this is caught up by starting the next step at the previous deadline; beyond
# it (the process was stopped, the machine is saturated) the engine resumes from now.
_CATCH_UP_SLACK = 0.250


class EngineClosedError(RuntimeError):
    """The engine stopped (server shutdown or crash) before the request finished."""


class RequestStream:
    """Tokens of one request, in order, as an async iterator.

    Iteration ends after the token marked ``finished``. Raises :class:`EngineClosedError` if
    the engine goes away first.
    """

    def __init__(self, request: SimRequest) -> None:
        self.request = request
        self._queue: asyncio.Queue[TokenOutput | None] = asyncio.Queue()
        self.done = False

    def put(self, output: TokenOutput | None) -> None:
        """Deliver a token, or None for "engine closed"."""
        self._queue.put_nowait(output)

    async def get(self) -> TokenOutput:
        """Wait for the next token.

        Raises:
            StopAsyncIteration: After the last token.
            EngineClosedError: If the engine stopped.

        """
        if self.done:
            raise StopAsyncIteration
        output = await self._queue.get()
        if output is None:
            self.done = True
            raise EngineClosedError("simulated engine stopped")
        if output.finished:
            self.done = True
        return output

    def __aiter__(self) -> AsyncIterator[TokenOutput]:
        return self

    async def __anext__(self) -> TokenOutput:
        return await self.get()


class EngineRunner:
    """Runs an engine's step loop as an asyncio task.

    Args:
        engine: The engine; its clock must be ``time.monotonic``.
        speed: Read before every step and copied to ``engine.speed``, so a caller can change
            the clock factor of a running simulator.

    """

    def __init__(self, engine: Engine, speed: Callable[[], float] | None = None) -> None:
        self.engine = engine
        self._speed = speed
        self._streams: dict[str, RequestStream] = {}
        self._wakeup = asyncio.Event()
        self._released = asyncio.Event()
        self._released.set()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def held(self) -> bool:
        """Whether the engine is held (see :meth:`hold`)."""
        return not self._released.is_set()

    def hold(self) -> None:
        """Stop stepping after the current step, until :meth:`release`.

        Running requests keep their slots and get no token; new ones wait. A test or a load
        run holds the engine so that what it waits for cannot be overtaken by requests ending.
        """
        self._released.clear()

    def release(self) -> None:
        """Step again after :meth:`hold` (from now: the held time is not caught up)."""
        self._released.set()

    def start(self) -> None:
        """Start the step loop on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        """Stop the loop and end every open stream with :class:`EngineClosedError`."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._close_streams()

    def submit(self, request: SimRequest) -> RequestStream:
        """Queue ``request`` in the engine and return its token stream.

        Raises:
            EngineClosedError: If the runner was stopped.
            ValueError: From ``Engine.add_request`` validation.

        """
        if self._closed:
            raise EngineClosedError("simulated engine stopped")
        self.engine.add_request(request)
        stream = RequestStream(request)
        self._streams[request.request_id] = stream
        self._wakeup.set()
        return stream

    def abort(self, request_id: str) -> None:
        """Abort a request if it is still in the engine (idempotent)."""
        self._streams.pop(request_id, None)
        self.engine.abort_request(request_id)

    async def _run(self) -> None:
        deadline = 0.0
        try:
            while True:
                if not self._released.is_set():
                    await self._released.wait()
                    deadline = 0.0  # the held time is not caught up
                if self._speed is not None:
                    self.engine.speed = self._speed()
                plan = self.engine.schedule()
                if plan is None:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                now = time.monotonic()
                start = deadline if 0.0 <= now - deadline <= _CATCH_UP_SLACK else now
                deadline = start + plan.duration
                delay = deadline - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    await asyncio.sleep(0)  # let handlers run even when steps are free
                for output in self.engine.finish_step(plan):
                    stream = self._streams.get(output.request.request_id)
                    if stream is not None:
                        stream.put(output)
                        if output.finished:
                            del self._streams[output.request.request_id]
        except Exception:
            _log.exception("simulated engine loop crashed")
            raise
        finally:
            # Crash or cancellation: nobody may wait forever for a token.
            self._closed = True
            self._close_streams()

    def _close_streams(self) -> None:
        for stream in self._streams.values():
            stream.put(None)
        self._streams.clear()
