"""HTTP pieces shared by the vLLM and TGI front ends: SSE, disconnects, JSON.

A client that disconnects must free its engine slot at once, as vLLM's and TGI's do, even if
its request is still queued and no byte would be written for a while. Both helpers here
therefore listen for ``http.disconnect`` alongside the work and cancel the work when it
arrives; the work's ``finally`` aborts the engine request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

__all__ = [
    "BodyError",
    "DropConnection",
    "EventStreamResponse",
    "dumps",
    "read_json_object",
    "sse_data",
    "until_disconnect",
]

T = TypeVar("T")


class DropConnection(Exception):
    """Raised by an event stream to cut the connection without finishing the response."""


class BodyError(ValueError):
    """The request body is not a JSON object."""


def dumps(obj: object) -> str:
    """Serialise compactly, as pydantic and serde do (no spaces, UTF-8 kept)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def sse_data(obj: object) -> bytes:
    """Return one server-sent event carrying ``obj`` as JSON (or a raw string)."""
    payload = obj if isinstance(obj, str) else dumps(obj)
    return f"data: {payload}\n\n".encode()


async def read_json_object(request: Request) -> dict[str, object]:
    """Return the body as a JSON object.

    Raises:
        BodyError: If it is not valid JSON or not an object.

    """
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BodyError(f"invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise BodyError("the JSON body must be an object")
    return body


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """Await ``work`` unless the client disconnects first.

    Returns:
        The result, or None if the client went away (``work`` is then cancelled).

    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    if task.cancelled():
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
    return task.result()


class EventStreamResponse(Response):
    """An ASGI response streaming server-sent events from an async iterator of bytes.

    The iterator is cancelled when the client disconnects. If it raises
    :class:`DropConnection` the response ends without its final empty body message, so the
    server closes the connection mid-stream: the client sees a truncated chunked body.

    Args:
        events: Encoded events.
        headers: Extra response headers.
        media_type: Content type.
        on_close: Called once when the response ends for any reason, even if ``events``
            never started (its own ``finally`` would then not run).

    """

    def __init__(
        self,
        events: AsyncIterator[bytes],
        headers: Mapping[str, str] | None = None,
        media_type: str = "text/event-stream; charset=utf-8",
        on_close: Callable[[], None] | None = None,
    ) -> None:
        # Response.__init__ is not called: it would add "content-length: 0".
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self._events = events
        self._on_close = on_close
        self.raw_headers = [(b"content-type", media_type.encode())]
        self.raw_headers.extend(
            (k.lower().encode(), v.encode()) for k, v in (headers or {}).items()
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the response."""
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            pump = asyncio.ensure_future(self._pump(send))
            watcher = asyncio.ensure_future(_wait_disconnect(receive))
            try:
                await asyncio.wait({pump, watcher}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (pump, watcher):
                    task.cancel()
                results = await asyncio.gather(pump, watcher, return_exceptions=True)
        finally:
            if self._on_close is not None:
                self._on_close()
        error = results[0]
        if isinstance(error, DropConnection):
            return  # returning without more_body=False makes the server close the socket
        if isinstance(error, Exception):
            raise error

    async def _pump(self, send: Send) -> None:
        try:
            async for chunk in self._events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            # Close the generator now, in this task, so its cleanup (engine abort) runs
            # before the response returns rather than whenever it is garbage collected.
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
