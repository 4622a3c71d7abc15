"""A generation stream fails after ``timeout`` seconds without data, and only then.

The bound is the stream's own idle watch (one timer per stream, not one per read): a backend
that stops sending mid-stream, or never answers, fails the request retryable UNAVAILABLE
within about the timeout; a slow stream whose every gap is shorter runs to its end however
long it takes in all. Both framings (the gRPC door's text stream and the HTTP door's relayed
chunks) read through it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import grpc
import pytest
from aiohttp import web

from fairq_server.backends.request import BackendRequest, Sampling, StreamEnd
from fairq_server.backends.vllm import VllmBackend
from fairq_server.doors.grpc.status import status_for
from fairq_server.errors import BackendError

from ...scripted_http import serve

TIMEOUT = 0.5
PROMPT = BackendRequest(model="tiny", prompt="hello", sampling=Sampling(max_tokens=8))
FRAMINGS = {"text": PROMPT, "relayed chunks": replace(PROMPT, relay_chunks=True)}
EVENT = b'data: {"choices":[{"text":"a"}]}\n\n'
LAST = b'data: {"choices":[{"text":"b","finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'


class Scripted:
    """Sends ``events`` with ``gap`` seconds before each, then stalls (or ends with ``LAST``)."""

    def __init__(self, events: int, gap: float, end: bool, headers: bool = True) -> None:
        self.events, self.gap, self.end, self.headers = events, gap, end, headers
        self.hung_up = asyncio.Event()

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            if not self.headers:
                await asyncio.Event().wait()  # never answers
            answer = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await answer.prepare(request)
            for _ in range(self.events):
                # Real clock: a loopback HTTP server's gaps against the idle watch's loop timer.
                await asyncio.sleep(self.gap)
                await answer.write(EVENT)
            if not self.end:
                await asyncio.Event().wait()  # silent, the connection open
            await answer.write(LAST)
            return answer
        finally:
            self.hung_up.set()


async def run(handler: Scripted, request: BackendRequest) -> tuple[list[object], float]:
    """Stream ``request`` from a vLLM adapter with the timeout; (events, seconds taken)."""
    async with serve(handler) as url:
        backend = VllmBackend("v", url, ["tiny"], timeout=TIMEOUT)
        started, events = time.monotonic(), []
        try:
            async with asyncio.timeout(20):
                async for event in backend.stream(request, 0):
                    events.append(event)
        finally:
            elapsed = time.monotonic() - started
            await backend.aclose()
    return events, elapsed


@pytest.mark.parametrize("framing", FRAMINGS)
async def test_a_backend_silent_mid_stream_fails_after_the_timeout(framing: str) -> None:
    handler = Scripted(events=2, gap=0.0, end=False)
    started = time.monotonic()
    with pytest.raises(BackendError, match=f"no data from the backend for {TIMEOUT:g} s") as info:
        await run(handler, FRAMINGS[framing])
    elapsed = time.monotonic() - started
    assert status_for(info.value)[0] == grpc.StatusCode.UNAVAILABLE
    assert info.value.retryable
    # Not before the timeout; the upper bound only catches a stream that waited far longer
    # (the watch re-arms at most once per timeout).
    assert TIMEOUT * 0.95 <= elapsed < 10 * TIMEOUT, elapsed
    async with asyncio.timeout(5):
        await handler.hung_up.wait()  # the connection was closed: the backend aborts


@pytest.mark.parametrize("framing", FRAMINGS)
async def test_a_backend_that_never_answers_fails_after_the_timeout(framing: str) -> None:
    handler = Scripted(events=0, gap=0.0, end=False, headers=False)
    started = time.monotonic()
    with pytest.raises(BackendError) as info:
        await run(handler, FRAMINGS[framing])
    assert info.value.retryable
    assert TIMEOUT * 0.95 <= time.monotonic() - started < 10 * TIMEOUT


@pytest.mark.parametrize("framing", FRAMINGS)
async def test_a_slow_stream_with_short_gaps_runs_past_the_timeout_to_its_end(
    framing: str,
) -> None:
    # Six gaps of 0.4 of the timeout each: 2.4 timeouts in all, none of them idle.
    events, elapsed = await run(Scripted(events=6, gap=0.4 * TIMEOUT, end=True), FRAMINGS[framing])
    assert elapsed >= 2.4 * TIMEOUT * 0.95, elapsed
    assert isinstance(events[-1], StreamEnd)
    assert events[-1].finish_reason == "stop"
