"""Decoupling a backend stream from the client stream it feeds.

A pump task reads the backend as fast as it answers; the caller takes whatever has
accumulated since its last write and merges it. When fairq keeps up, every backend event goes
out on its own, with no added latency; when the client side or the CPU falls behind, text
merges into fewer, larger messages instead of the relay falling further behind (each gRPC
message costs about as much as a short one).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

from fairq_server.backends.base import StreamEnd, StreamEvent, TextDelta

__all__ = ["merged"]

_END = object()


async def merged(stream: AsyncGenerator[StreamEvent]) -> AsyncGenerator[StreamEvent]:
    """Yield ``stream``'s events, merging text deltas that arrived while the caller was busy.

    Exceptions of ``stream`` are re-raised here, after the events that preceded them.
    Closing this iterator cancels the pump and closes ``stream`` (aborting the backend
    request).
    """
    queue: asyncio.Queue[object] = asyncio.Queue()

    async def pump() -> None:
        async with contextlib.aclosing(stream):
            try:
                async for event in stream:
                    queue.put_nowait(event)
            except Exception as exc:
                queue.put_nowait(exc)
                return
        queue.put_nowait(_END)

    task = asyncio.create_task(pump())
    try:
        while True:
            items = [await queue.get()]
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
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
