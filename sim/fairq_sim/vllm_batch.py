"""A list of prompts on ``/v1/completions``, answered as vLLM answers it.

vLLM runs each prompt of a list as its own engine request (ids ``<id>-<i>``) with the same
sampling parameters, and answers with one response: choice ``index`` ``i`` per prompt, the
usage summed, and (streamed) every prompt's chunks as they come, one usage chunk when asked
for, and one ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from starlette.responses import JSONResponse, Response

from fairq_sim.http_common import sse_data

__all__ = ["Part", "collect_batch", "stream_batch"]


class Part(Protocol):
    """One prompt's reply (the single-prompt reply of :mod:`fairq_sim.vllm_api`)."""

    def close(self) -> None:
        """Abort the prompt's engine request unless it finished."""

    def events(self) -> AsyncIterator[bytes]:
        """Yield the prompt's SSE body."""

    async def collect(self) -> Response:
        """Return the prompt's non-streamed response."""


def _sum_usage(total: dict[str, Any], usage: object) -> None:
    if isinstance(usage, dict):
        for key, value in usage.items():
            if isinstance(value, int) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
            else:
                total.setdefault(key, value)


async def collect_batch(parts: Sequence[Part], response_id: str) -> Response:
    """Return the one non-streamed response to a list of prompts (or the first error)."""
    try:
        answers = await asyncio.gather(*(p.collect() for p in parts))
    finally:
        for part in parts:
            part.close()
    bodies = []
    for answer in answers:
        if answer.status_code != 200:
            return answer
        bodies.append(json.loads(bytes(answer.body)))
    body = {**bodies[0], "id": response_id, "choices": [], "usage": {}}
    for i, each in enumerate(bodies):
        body["choices"] += [{**c, "index": i} for c in each["choices"]]
        _sum_usage(body["usage"], each.get("usage"))
    return JSONResponse(body)


async def stream_batch(
    parts: Sequence[Part], response_id: str, include_usage: bool
) -> AsyncIterator[bytes]:
    """Yield the one SSE body of a list of prompts, every prompt's chunks as they come."""
    queue: asyncio.Queue[tuple[int, bytes | None]] = asyncio.Queue()

    async def pump(i: int, part: Part) -> None:
        try:
            async for frame in part.events():
                await queue.put((i, frame))
        finally:
            await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, p)) for i, p in enumerate(parts)]
    usage: dict[str, Any] = {}
    head: dict[str, Any] = {}
    try:
        running = len(tasks)
        while running:
            i, frame = await queue.get()
            if frame is None:
                running -= 1
                continue
            payload = frame.decode().removeprefix("data: ").strip()
            if payload == "[DONE]":
                continue
            chunk = json.loads(payload)
            if "error" in chunk:
                yield frame
                continue
            head = head or chunk
            if not chunk.get("choices") and isinstance(chunk.get("usage"), dict):
                _sum_usage(usage, chunk["usage"])
                continue
            chunk["id"] = response_id
            chunk["choices"] = [{**c, "index": i} for c in chunk["choices"]]
            yield sse_data(chunk)
        if include_usage:
            yield sse_data({**head, "id": response_id, "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for part in parts:
            part.close()
