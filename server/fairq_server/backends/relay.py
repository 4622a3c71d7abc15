"""Decoupling a backend stream from the client stream it feeds.

A pump task reads the backend as fast as it answers; the caller takes whatever has
accumulated since its last write and merges it. Each message towards the client costs about
the same whatever its length, and a relay's CPU goes mostly to per-message work, so a fast
stream is sent at most once per ``window``: the first token goes out at once, later text
waits at most one window (20 ms by default, far below what a reader notices) and leaves as
one chunk. A slow stream, one event per window or less, is relayed event by event. The
backend is read on the same rhythm once fairq has caught up with it (see ``_pump``).

The pump starts when the relay is made, not when it is first read: requests dispatched
together then reach the backend in the order they were dispatched, whatever order their
clients are told they started in.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator

from fairq_server import loop_share
from fairq_server.backends.base import StreamEnd, StreamEvent, TextDelta

__all__ = ["Relay"]

_END = object()
# A read that took longer than this waited for the network (a buffered one takes ~20 us).
_CAUGHT_UP = 0.001


class Relay:
    """``stream``'s events, text arriving within ``window`` of the last send merged.

    Iterate it once. Exceptions of ``stream`` are re-raised by the iteration, after the
    events that preceded them. :meth:`aclose` (also when never iterated) cancels the pump and
    closes ``stream``, which aborts the backend request.
    """

    def __init__(self, stream: AsyncGenerator[StreamEvent], window: float = 0.0) -> None:
        self._window = window
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._task = asyncio.create_task(self._pump(stream))
        self._events = self._merged()

    def __aiter__(self) -> AsyncGenerator[StreamEvent]:
        return self._events

    async def aclose(self) -> None:
        """Stop reading the backend and close its stream."""
        await self._events.aclose()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _pump(self, stream: AsyncGenerator[StreamEvent]) -> None:
        queue, window = self._queue, self._window
        async with contextlib.aclosing(stream):
            # Opening a backend request is bulk work: a wave of finished streams frees as
            # many slots at once.
            await loop_share.turn()
            try:
                asked = time.monotonic()
                async for event in stream:
                    queue.put_nowait(event)
                    now = time.monotonic()
                    if window and isinstance(event, TextDelta) and now - asked > _CAUGHT_UP:
                        # This read waited for the network: fairq has caught up with the
                        # backend. Waiting out a window before the next read lets the
                        # socket gather that window's tokens, which then come out of the
                        # HTTP parser's buffer at once, instead of waking fairq per token.
                        await asyncio.sleep(window)
                        now = time.monotonic()
                    asked = now
            except Exception as exc:
                queue.put_nowait(exc)
                return
        queue.put_nowait(_END)

    async def _merged(self) -> AsyncGenerator[StreamEvent]:
        queue, window = self._queue, self._window
        last_sent = -window
        while True:
            items = [await queue.get()]
            wait = last_sent + window - time.monotonic()
            if wait > 0 and isinstance(items[0], TextDelta):
                await asyncio.sleep(wait)  # pacing: let the rest of this window arrive
            while not queue.empty():
                items.append(queue.get_nowait())
            texts: list[str] = []
            tokens = 0
            for item in items:
                if isinstance(item, TextDelta):
                    texts.append(item.text)
                    tokens += item.tokens
                    continue
                if texts:
                    yield TextDelta("".join(texts), tokens)
                    texts, tokens = [], 0
                if item is _END:
                    return
                if isinstance(item, Exception):
                    raise item
                assert isinstance(item, StreamEnd)
                yield item
            if texts:
                yield TextDelta("".join(texts), tokens)
            last_sent = time.monotonic()
