"""Open-loop replay of a request schedule against any target, with per-request timings."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

__all__ = ["RequestResult", "RequestSpec", "SendFn", "replay", "time_to_first_text"]


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload.

    Attributes:
        user: who sends it (the fairness identity).
        prompt: prompt text.
        max_tokens: output length (sent with ``ignore_eos`` so it is exact).
        at: seconds after the start of the run when it is sent.
        tier: requested tier ("" = the user's default); ignored by direct targets.
    """

    user: str
    prompt: str
    max_tokens: int
    at: float = 0.0
    tier: str = ""


@dataclass(frozen=True)
class RequestResult:
    """What happened to one request; times are seconds from the start of the run."""

    spec: RequestSpec
    sent: float
    first_token: float | None
    done: float
    chunks: int
    chars: int
    error: str = ""

    @property
    def ttft(self) -> float:
        """Time to first token, or to the end if no token came."""
        return (self.first_token if self.first_token is not None else self.done) - self.sent


SendFn = Callable[[RequestSpec], AsyncIterator[str]]
"""Sends one request and yields its text chunks as they stream."""


async def _one(spec: RequestSpec, send: SendFn, start: float) -> RequestResult:
    delay = start + spec.at - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)  # open loop: the schedule, not completions, sets the pace
    sent = time.monotonic() - start
    first: float | None = None
    chunks = chars = 0
    error = ""
    try:
        async for text in send(spec):
            if first is None and text:
                first = time.monotonic() - start
            chunks += 1
            chars += len(text)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    return RequestResult(spec, sent, first, time.monotonic() - start, chunks, chars, error)


async def replay(
    specs: Sequence[RequestSpec],
    send: SendFn,
    *,
    on_done: Callable[[RequestResult], None] | None = None,
) -> list[RequestResult]:
    """Send every request at its scheduled time and wait for all of them.

    Args:
        specs: the schedule.
        send: the target.
        on_done: called as each request finishes (progress display).

    Returns:
        Results in the order of ``specs``.
    """
    start = time.monotonic()

    async def run(spec: RequestSpec) -> RequestResult:
        result = await _one(spec, send, start)
        if on_done is not None:
            on_done(result)
        return result

    return list(await asyncio.gather(*(run(s) for s in specs)))


async def time_to_first_text(send: SendFn, spec: RequestSpec) -> float:
    """Send ``spec`` and read it to the end; return the seconds to its first text (NaN: none)."""
    start = time.monotonic()
    first = None
    async for text in send(spec):
        if first is None and text:
            first = time.monotonic() - start
    return first if first is not None else float("nan")
